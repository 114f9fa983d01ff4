"""llama.cpp through llama-cpp-python's low-level API: backend start-up, context wrappers, the
parameters a context is made with, measurement of what llama.cpp allocates.

May import: app.build (the build's facts), app.errors.
"""
