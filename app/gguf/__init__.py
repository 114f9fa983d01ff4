"""GGUF files: the header reader, model info, the vocabulary probe, pairing rules, synthetic stand-ins.

May import: app.llama (the vocabulary probe loads a model vocab-only), app.errors, app.units.
"""
