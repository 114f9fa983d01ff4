"""Operating specdeck as a service: alert rules over the server's figures (`alerts`), numbered
configuration revisions with last-known-good fallback (`revisions`), the go-live checklist run over
HTTP (`validate`) and the baselines it is compared with (`baseline`).

May import: app.settings, app.errors, app.units. Never the server, the engine or the commands:
it speaks to a server only through its HTTP API.
"""
