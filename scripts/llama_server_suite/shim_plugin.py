"""pytest plugin loaded by run.sh (-p shim_plugin) for the llama.cpp server suite.

conftest.py's session fixture calls ServerPreset.load_all(), which starts every preset once
so that llama-server downloads its model. Under the shim every preset is the same local
GGUF and nothing downloads, so that warm-up (eight server starts) is skipped.
"""
import sys


def pytest_configure(config):
    try:
        import utils  # the suite's utils.py (rootdir is on sys.path via conftest)
    except ImportError:
        return
    utils.ServerPreset.load_all = staticmethod(lambda: print("shim_plugin: load_all skipped", file=sys.stderr))
