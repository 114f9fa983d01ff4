"""The chat template a model without one is served with: ChatML, as llama-server falls back to it
(Ollama to its Modelfile's template). It mentions no tools, so tool calls take the generic JSON
format (app/chat/generic.py) and there is no reasoning block, as with any such template. A light
module: the start's records name it before anything of the server is imported."""

from __future__ import annotations

CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
FALLBACK = "chatml (fallback)"
STOPS = ("<|im_end|>",)  # a model not trained on ChatML writes its end of turn as text
NOTE = "the model has no chat template: chat uses ChatML, as llama-server does (--chat-template-file sets another)"


def served_template(given: str | None, own: str | None) -> str | None:
    """The template served in place of the model's own: the one given, else ChatML where the model
    has none; None: the model's own."""
    if given is not None:
        return given
    return None if own else CHATML


def origin(served: str | None, own: str | None) -> str:
    """Where the template served comes from (`served`: served_template's answer), as the listings
    say it: "model" (its own), "file" (given) or FALLBACK."""
    if served is None:
        return "model"
    return FALLBACK if served == CHATML and not own else "file"
