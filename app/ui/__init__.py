"""The page for people: a chat page and a monitor served by specdeck itself, its conversations kept
on the server.

  routes.py   GET / for browsers (programs keep their answers), the page's files, and its JSON API
              under /ui/api/ (conversations, export, import, turns, their live events)
  store.py    the conversations in SQLite (WAL) in specdeck's state folder, one owner per API key
  monitor.py  the monitor's routes: /ui/api/series (the last hour as JSON columns) and /ui/api/live
              (each new row as a server-sent event), read from app/monitor's history
  turns.py    an answer written by the server as it streams: the page's turn goes through the
              server's own OpenAI route in-process, so the figures are the API's own records
  static/     the page (HTML, CSS, JS, no build step) and its vendored libraries (static/vendor/,
              pinned with their integrity hashes by scripts/vendor_ui.py)

It speaks to the models only through the server's HTTP routes (in-process, as ASGI), so it imports
nothing of the server or the engine: only the settings (where the state folder is), errors, and
the monitor's history (app/monitor/).
"""
