"""llama.cpp through llama-cpp-python's low-level API: backend start-up, context wrappers, measurement."""
