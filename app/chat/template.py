"""A chat template given as a file (--chat-template-file, a preset's chat_template_file): read and
proved to compile before anything loads, and rendered as llama-cpp-python renders a GGUF's own."""

from __future__ import annotations

from pathlib import Path

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from app.chat.detect import Render
from app.errors import SpecdeckError


def read_template(path: Path) -> str:
    """The template's text; a clear one-line error for a missing file, bad UTF-8 or Jinja syntax."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecdeckError(f"chat template {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecdeckError(f"chat template {path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    check_template(text, str(path))
    return text


def check_template(text: str, where: str) -> None:
    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise SpecdeckError(f"chat template {where}: line {e.lineno}: {e.message}",
                            hint="it must be a Jinja chat template, as in a GGUF's tokenizer.chat_template") from None
    if not text.strip():
        raise SpecdeckError(f"chat template {where} is empty")


def jinja_render(source: str, bos: str = "", eos: str = "") -> Render:
    """Render messages through `source` as the server does (for detection, `specdeck check`)."""
    def render(messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        fmt = Jinja2ChatFormatter(source, eos, bos, add_generation_prompt=generation_prompt)
        return fmt(messages=messages, tools=tools or None).prompt

    return render
