"""The local API: an OpenAI-compatible server in front of the speculative engine."""
