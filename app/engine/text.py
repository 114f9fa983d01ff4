"""Text in and out of token ids, and chat messages through the model's own template (from its GGUF)."""

from __future__ import annotations

import ctypes
import re

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from app.errors import SpecdeckError
from app.llama.context import Model


class Tokenizer:
    def __init__(self, model: Model, chat_template: str | None) -> None:
        self.model = model
        self.vocab = model.vocab
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self.vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.stop_tokens = {t for t in range(model.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)}
        self.chat_template = chat_template
        self._formatter = (Jinja2ChatFormatter(chat_template, self.piece(self.eos), self.piece(self.bos))
                           if chat_template else None)

    def encode(self, text: str, add_special: bool | None = None, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8", errors="replace")
        add = self.add_bos if add_special is None else add_special
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = True) -> str:
        return self.piece_bytes(token, special).decode("utf-8", errors="replace")

    def piece_bytes(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def decode(self, tokens: list[int]) -> str:
        return b"".join(self.piece_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None, thinking: bool | None = None,
                    generation_prompt: bool = True, extra: dict | None = None) -> str:
        """`thinking` switches a template's thinking mode (its `enable_thinking` variable), where it has one;
        `generation_prompt` False leaves out the assistant turn's opening (llama-server's /apply-template);
        `extra`: more template variables (llama-server's chat_template_kwargs)."""
        if self._formatter is None:
            raise SpecdeckError("this model has no chat template: send a plain prompt instead of messages")
        variables = {k: v for k, v in (extra or {}).items() if k not in ("messages", "tools", "add_generation_prompt")}
        if thinking is not None and self.has_thinking_mode:
            variables["enable_thinking"] = thinking
        fmt = self._formatter
        if not generation_prompt:
            fmt = Jinja2ChatFormatter(self.chat_template, self.piece(self.eos), self.piece(self.bos), add_generation_prompt=False)
        return fmt(messages=messages, tools=tools or None, **variables).prompt

    @property
    def has_thinking_mode(self) -> bool:
        return bool(self.chat_template) and "enable_thinking" in self.chat_template

    @property
    def supports_tools(self) -> bool:
        """Does the chat template render tool definitions? (It must read the `tools` variable.)"""
        return bool(self.chat_template) and re.search(r"\btools\b", self.chat_template) is not None

    def chat_tokens(self, messages: list[dict], tools: list[dict] | None = None, thinking: bool | None = None) -> list[int]:
        return self.prompt_tokens(self.render_chat(messages, tools, thinking))

    def prompt_tokens(self, text: str) -> list[int]:
        """A rendered chat prompt's ids (BOS added where the model wants one and the template did not write it)."""
        return self.encode(text, add_special=self.wants_bos(text))

    def wants_bos(self, text: str) -> bool:
        """Does a rendered prompt need BOS added: the model wants one and the template did not write it?"""
        return self.add_bos and not text.startswith(self.piece(self.bos))

    def markup_tokens(self, markup: tuple[str, ...]) -> set[int]:
        """Tokens that are one of these strings but render as nothing as plain text (control tokens such
        as Mistral's [TOOL_CALLS]): the answer's text must show them for its format to be parsed."""
        out = set()
        for text in markup:
            ids = self.encode(text, add_special=False, parse_special=True)
            if len(ids) == 1 and not self.piece_bytes(ids[0]):
                out.add(ids[0])
        return out
