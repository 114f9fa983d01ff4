"""GGUF files: the header reader, model info, the vocabulary probe, pairing rules, synthetic stand-ins."""
