"""Images in a prompt. A prompt stays one list of ints: text tokens are vocabulary ids (>= 0), and
each position an image fills holds a negative *media id* that names the image (a hash of its
pixels) and the row of its embedding. Everything that compares prompts (the prefix cache, saved
prompts, checkpoints) so compares images by their pixels with no change: a resent screenshot matches
its cached positions, a changed one departs at its first position. Only what decodes a prompt
(kv.evaluate) looks closer: a run of media ids goes to llama.cpp as embedding rows."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

ROW_BITS = 24  # rows of one image (a 27B projector gives at most a few thousand)
KEY_BITS = 62


def is_media(token: int) -> bool:
    return token < 0


def has_media(tokens: Sequence[int], start: int = 0, end: int | None = None) -> bool:
    part = tokens[start:end]
    return bool(part) and min(part) < 0


def media_id(key: int, row: int) -> int:
    return -(1 + (key << ROW_BITS) + row)


def key_of(token: int) -> int:
    return (-token - 1) >> ROW_BITS


def row_of(token: int) -> int:
    return (-token - 1) & ((1 << ROW_BITS) - 1)


def pixel_key(width: int, height: int, rgb: bytes) -> int:
    """An image's key: a hash of its size and RGB pixels (the same picture sent as PNG or as JPEG of
    the same pixels is the same image)."""
    h = hashlib.sha256(f"{width}x{height}:".encode() + rgb).digest()
    return int.from_bytes(h[:8], "little") >> (64 - KEY_BITS)


@dataclass(frozen=True)
class Picture:
    """Decoded pixels (RGB, 8 bits a channel, row-major) and their key."""

    width: int
    height: int
    rgb: bytes

    @cached_property
    def key(self) -> int:
        """Hashed once (a screenshot's pixels are megabytes; every lookup by image reads the key)."""
        return pixel_key(self.width, self.height, self.rgb)


@dataclass(frozen=True)
class Run:
    """tokens[start:end]: text (media False) or rows [row, row + end - start) of one image."""

    start: int
    end: int
    media: bool
    key: int = 0
    row: int = 0


def runs(tokens: Sequence[int], start: int, end: int) -> Iterator[Run]:
    """tokens[start:end] split into runs of text and runs of one image's consecutive rows."""
    i = start
    while i < end:
        t = tokens[i]
        if t >= 0:
            j = i + 1
            while j < end and tokens[j] >= 0:
                j += 1
            yield Run(i, j, False)
        else:
            key, row = key_of(t), row_of(t)
            j = i + 1
            while j < end and tokens[j] < 0 and key_of(tokens[j]) == key and row_of(tokens[j]) == row + j - i:
                j += 1
            yield Run(i, j, True, key, row)
        i = j


def image_end(tokens: Sequence[int], at: int) -> int:
    """`at`, or where the image that position `at` falls inside ends (a cut that must not split one)."""
    if at <= 0 or at >= len(tokens) or tokens[at] >= 0 or tokens[at - 1] >= 0 or key_of(tokens[at]) != key_of(tokens[at - 1]):
        return at
    key = key_of(tokens[at])
    while at < len(tokens) and tokens[at] < 0 and key_of(tokens[at]) == key and row_of(tokens[at]) > 0:
        at += 1
    return at


IMAGE = -1  # what `folded` puts where an image's rows are


def folded(tokens: Sequence[int]) -> Sequence[int]:
    """The tokens with every media id as IMAGE (for indexes that keep 32-bit tokens and never draft
    an image); the sequence itself where it holds none."""
    if not has_media(tokens):
        return tokens
    return [t if t >= 0 else IMAGE for t in tokens]


def image_tokens(key: int, n: int) -> list[int]:
    return [media_id(key, r) for r in range(n)]


def text_only(tokens: Sequence[int]) -> list[int]:
    """The text tokens (what a log or a text-only consumer may read)."""
    return [t for t in tokens if t >= 0]
