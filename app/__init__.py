"""specdeck: a ~27B GGUF target plus a small draft model, speculative decoding, one 24 GB GPU."""

__version__ = "0.1.0"
