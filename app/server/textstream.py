"""Token ids to text as they arrive: whole UTF-8 characters only, and stop strings honoured.

Text that could be the start of a stop string is held back until it is clearly not one, so a
client never sees a stop string, nor half of one.
"""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stops: list[str]) -> None:
        self.piece = piece
        self.stops = [s for s in stops if s]
        self.pending = b""  # bytes of an unfinished UTF-8 character
        self.held = ""  # text that may begin a stop string
        self.stopped = False
        self.stopped_by: str | None = None  # the stop string that ended the text

    def _decode(self, data: bytes) -> str:
        data = self.pending + data
        for cut in range(len(data), max(len(data) - 4, -1), -1):
            try:
                text = data[:cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
            self.pending = data[cut:]
            return text
        self.pending = b""
        return data.decode("utf-8", errors="replace")

    def push(self, tokens: list[int]) -> str:
        """New text safe to send; sets `stopped` when a stop string appears (it is not included)."""
        if self.stopped:
            return ""
        text = self.held + self._decode(b"".join(self.piece(t) for t in tokens))
        for s in self.stops:
            i = text.find(s)
            if i >= 0:
                self.stopped, self.stopped_by = True, s
                self.held = ""
                return text[:i]
        keep = 0
        for s in self.stops:  # the longest tail of text that is a prefix of a stop string
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end: whatever is held back (and any unfinished character, replaced)."""
        if self.stopped:
            return ""
        out = self.held + (self.pending.decode("utf-8", errors="replace") if self.pending else "")
        self.held, self.pending = "", b""
        return out
