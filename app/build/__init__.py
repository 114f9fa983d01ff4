"""The llama.cpp build specdeck runs on: which one to compile for this machine, and proof that it decodes.

- `isa`: the instruction sets this CPU advertises (/proc/cpuinfo) and the ones a build uses
  (llama.cpp's system info), side by side.
- `smoke`: a decode of a tiny quantized model in a subprocess; a build that dies by a signal
  (SIGILL on a VM that advertises AMX it cannot run) is named, never met later.
- `ladder`: install.sh's build step: native first, then without the instruction set that failed,
  then a portable AVX2 build; wheels kept in a cache keyed by CPU and build options.

`isa` and `ladder` use only the standard library (they run before specdeck's dependencies are
installed); `smoke` needs numpy, gguf and llama-cpp-python.

May import: app.llama.backend (only `info`, to read the build's system info). Nothing else of specdeck.
"""
