"""Reasoning apart from the answer: the text between a template's reasoning markers (`<think>` and
`</think>` for Qwen3 and DeepSeek-R1; Gemma 4's thought channel). A template that opens the
reasoning in its generation prompt (Qwen3.5 with thinking on) makes the answer start inside it."""

from __future__ import annotations

from dataclasses import dataclass

from app.chat.format import held_prefix


@dataclass(frozen=True)
class Reasoning:
    opening: str = "<think>"
    closing: str = "</think>"

    def opened_by(self, prompt: str) -> bool:
        """Does the rendered prompt end inside an open reasoning block (the answer starts in it)?"""
        tail = prompt.rstrip()
        return tail.endswith(self.opening.rstrip())

    def split(self, text: str, started: bool, final: bool) -> tuple[str, str]:
        """(reasoning, the rest). `started`: the answer begins inside the reasoning. Partial: the
        reasoning stops before a tail that may begin the closing marker; text that may still become
        the opening marker is held (neither reasoning nor rest)."""
        if not started:
            lead = text.lstrip()
            if lead.startswith(self.opening):
                text, started = lead[len(self.opening):], True
            elif not final and lead and self.opening.startswith(lead):
                return "", ""
            elif not final and not lead:
                return "", ""
        if not started:
            return "", text
        end = text.find(self.closing)
        if end >= 0:
            return text[:end].strip(), text[end + len(self.closing):]
        if final:
            return text.strip(), ""
        body = text[: len(text) - held_prefix(text, self.closing)]
        return body.strip(), ""

    def without_stray_closing(self, text: str, final: bool) -> str:
        """An answer that never opened its reasoning may still close it (a model told not to think
        writes `</think>` anyway): the marker is dropped, never shown as content. Partial: a tail that
        may begin the marker is held."""
        text = text.replace(self.closing, "")
        return text if final else text[: len(text) - held_prefix(text, self.closing)]
