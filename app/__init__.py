"""specdeck: a ~27B GGUF target plus a small draft model, speculative decoding, one 24 GB GPU."""

from app.build.cudalibs import preload as _preload_cuda

__version__ = "0.1.0"

_preload_cuda()  # a CUDA build made with the toolkit from PyPI finds its libraries (no-op otherwise)
