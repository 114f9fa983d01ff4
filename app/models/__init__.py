"""Models on disk: the catalogue, references, the hub, GGUF headers read from the hub, mirrors,
fetching, integrity records, progress.

May import: app.gguf, app.settings, app.errors, app.units.
"""
