"""The speculative decoding engine: llama.cpp contexts, drafters, verification, records."""
