"""Every tool-call format handled, in the order detection tries them (the more specific first:
Qwen3-Coder's XML also sits in <tool_call> tags, so it comes before Hermes)."""

from __future__ import annotations

from app.chat.format import ToolFormat
from app.chat.hermes import Hermes
from app.chat.qwen3_coder import Qwen3Coder

ALL: tuple[ToolFormat, ...] = (Qwen3Coder(), Hermes())
BY_NAME = {f.name: f for f in ALL}


def without_native_tools(source: str) -> ToolFormat | None:
    """The format for a template that renders no tool call at all (None: none applies)."""
    return None
