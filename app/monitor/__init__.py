"""The monitor's history: the server's figures over the last hour (history) and how a status
snapshot becomes a row of them (figures). Imports nothing of the server, the engine or the page."""
