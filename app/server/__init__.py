"""The local API in front of the engine: `app` wires the routes, `core` owns submission, streaming,
errors and status, `answer` is the one path from the engine's events to an answer (chat formats
parsed into typed deltas), `openai`, `anthropic`, `responses`, `ollama` and `llamacpp` only format
those deltas; scheduler, schemas, limits, metrics, live figures, the alert watcher, systemd notification.

May import: app.chat, app.engine, app.ops, app.plan, app.llama, app.gguf, app.models, app.settings, app.errors, app.units.
Never the commands.
"""
