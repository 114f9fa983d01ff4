"""The local API in front of the engine: `app` wires the routes, `core` owns submission, streaming,
errors and status, `openai` and `ollama` translate their APIs onto it; scheduler, schemas, limits,
metrics, live figures, the alert watcher, systemd notification.

May import: app.engine, app.ops, app.plan, app.llama, app.gguf, app.models, app.settings, app.errors, app.units.
Never the commands.
"""
