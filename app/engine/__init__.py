"""The speculative decoding engine: drafters, the controller and its cost calibration, the verify
decode, acceptance, KV rollback, records; `loader` brings a plan to life.

May import: app.llama, app.plan, app.gguf, app.errors, app.units. Never the server, the commands
or any UI: everything it tells the outside goes through its records.
"""
