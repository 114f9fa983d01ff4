"""A chat format as served: the tool-call format of the template (or none), its reasoning markers
(or none), and the one line said at start when tool calls in the template's format are not parsed."""

from __future__ import annotations

from dataclasses import dataclass

from app.chat.format import ToolFormat
from app.chat.reasoning import Reasoning

NOT_PARSED = "tool calls in this template's format are not parsed; answers are returned as text"


@dataclass(frozen=True)
class ChatSpec:
    tools: ToolFormat | None = None
    reasoning: Reasoning | None = None
    note: str | None = None  # said once at start (e.g. NOT_PARSED)
    stops: tuple[str, ...] = ()  # text that ends an answer where the model may write it as text (the fallback's)

    @property
    def name(self) -> str:
        """What `specdeck check` and /props show: the tool format, and the reasoning markers if any."""
        parts = [self.tools.name if self.tools is not None else "content-only"]
        if self.reasoning is not None:
            parts.append(f"reasoning {self.reasoning.opening.strip()}...{self.reasoning.closing.strip()}")
        return ", ".join(parts)

    @property
    def markup(self) -> tuple[str, ...]:
        """Strings the answer's text must show even where they are special tokens (to be parsed)."""
        out = self.tools.markup if self.tools is not None else ()
        if self.reasoning is not None:
            out += (self.reasoning.opening.strip(), self.reasoning.closing.strip())
        return out

    def without_reasoning(self) -> ChatSpec:
        """--reasoning-format none: the answer's raw text, reasoning markers and all, as content."""
        return ChatSpec(self.tools, None, self.note, self.stops)
