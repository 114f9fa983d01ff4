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
        """(reasoning, the rest). `started`: the answer begins inside the reasoning. An answer that
        thought may think again: each later block is reasoning too (joined by a blank line), and a
        model that writes the opening the prompt already wrote opens nothing new, so no marker ever
        reaches the rest. Partial: text that may still become a marker is held (neither reasoning nor
        rest)."""
        lead = text.lstrip()
        if not started and not lead.startswith(self.opening) and (final or not self.opening.startswith(lead)):
            return "", text  # no reasoning, nor text that may still open it (_block holds that)
        thoughts: list[str] = []
        rest: list[str] = []
        at, inside = 0, True
        while at <= len(text):
            if inside:
                at, body, closed = self._block(text, at, final)
                thoughts.append(body.strip())
                if not closed:
                    break
                inside = False
            else:
                start = text.find(self.opening, at)
                piece = text[at:] if start < 0 else text[at:start]
                if start < 0 and not final:
                    piece = piece[: len(piece) - max(held_prefix(piece, self.opening), held_prefix(piece, self.closing))]
                rest.append(piece.replace(self.closing, ""))
                if start < 0:
                    break
                at, inside = start + len(self.opening), True
        return "\n\n".join(t for t in thoughts if t), "".join(rest)

    def _block(self, text: str, at: int, final: bool) -> tuple[int, str, bool]:
        """One reasoning block from `at`: (where the text after it starts, its body, whether it closed).
        An opening marker written again at its start is skipped; partial, a start that may become one
        is held, as is a tail that may begin the closing marker."""
        lead = text[at:].lstrip()
        if lead.startswith(self.opening):
            at = len(text) - len(lead) + len(self.opening)
        elif not final and lead and self.opening.startswith(lead):
            return len(text), "", False
        end = text.find(self.closing, at)
        if end >= 0:
            return end + len(self.closing), text[at:end], True
        body = text[at:]
        return len(text), body if final else body[: len(body) - held_prefix(body, self.closing)], False

    def without_stray_closing(self, text: str, final: bool) -> str:
        """An answer that never opened its reasoning may still close it (a model told not to think
        writes `</think>` anyway): the marker is dropped, never shown as content. Partial: a tail that
        may begin the marker is held."""
        text = text.replace(self.closing, "")
        return text if final else text[: len(text) - held_prefix(text, self.closing)]
