"""Every tool-call format handled, in the order detection tries them (the more specific first:
Qwen3-Coder's XML also sits in <tool_call> tags, so it comes before Hermes; Mistral Small 3.2's
[CALL_ID] before the plain [ARGS] syntax). A template with no tool support of its own gets the
generic JSON format (`without_native_tools`)."""

from __future__ import annotations

from collections.abc import Callable

from app.chat.format import ToolFormat
from app.chat.gemma4 import Gemma4
from app.chat.generic import Generic
from app.chat.hermes import Hermes
from app.chat.llama3 import Llama3
from app.chat.mistral import Mistral, MistralCallId, MistralNemo
from app.chat.qwen3_coder import Qwen3Coder

ALL: tuple[ToolFormat, ...] = (Qwen3Coder(), Hermes(), MistralCallId(), Mistral(), MistralNemo(), Gemma4(), Llama3())
BY_NAME = {f.name: f for f in (*ALL, Generic())}

_SYSTEM_PROBE = "probe system message"


def without_native_tools(source: str, render: Callable | None = None) -> ToolFormat | None:
    """The format for a template that renders no tool call at all: the generic JSON one when the
    template does not mention tools (None otherwise: it has tools of its own, not handled here).
    `render` (as detect.Render) tells whether the template takes a system message."""
    if "tools" in source:
        return None
    return Generic(system_role=render is None or _takes_system(render))


def _takes_system(render: Callable) -> bool:
    try:
        text = render([{"role": "system", "content": _SYSTEM_PROBE}, {"role": "user", "content": "probe question"}],
                      None, True)
    except Exception:  # noqa: BLE001 - a template that refuses a system message (Gemma 2)
        return False
    return _SYSTEM_PROBE in text
