"""Helpers the tests and scripts share: tiny GGUF models written with gguf, a local server that
speaks the hub's protocol, and a live specdeck server in a thread."""
