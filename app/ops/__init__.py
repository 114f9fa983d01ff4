"""Operating specdeck as a service: alert rules over the server's figures (`alerts`), numbered
configuration revisions with last-known-good fallback (`revisions`), a client of a server's HTTP API
(`client`), live readings of it (`readings`), the start-up smoke request (`smoke`), the go-live
checklist run over HTTP (`validate`) and the baselines it is compared with (`baseline`).

May import: app.settings, app.errors, app.units. Never the server, the engine or the commands:
it speaks to a server only through its HTTP API.
"""
