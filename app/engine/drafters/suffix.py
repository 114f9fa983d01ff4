"""Suffix drafting across requests: continuations found in recent requests' prompts and outputs
as well as in the current request (after SuffixDecoding, arXiv 2411.04975; written small).

Coding agents resend text from *other* requests: a module regenerated in a fresh conversation, two
sub-agents writing near-identical tests, tool-call JSON of a shape seen before, a rewrite of the
last answer given only a critique. Prompt lookup sees only the current request; this index holds
recent requests too, partitioned (by API key, in the server) so one client's text never drives
another's drafts: drafts cannot change an output, but their timing could reveal text.

`SuffixIndex` keeps one document per request: its prompt, then its output as it is generated.
Only the part of the prompt that no recent document of its partition already holds is indexed (a
conversation resent with one more turn adds that turn, not the whole conversation again). Per
partition, a table maps each `KEY`-gram to where it was followed by a token (the most recent
`MAX_OCCURRENCES`). `propose` takes the occurrences of the history's last `KEY` tokens, measures
how far back each matches the history (its depth, up to `MAX_DEPTH`), keeps the deepest, and walks
their continuations: at each position the token most of them agree on, keeping only those that
agree, until they disagree or run out. The match's depth and the number of occurrences behind its
first token are its confidence: the controller learns acceptance per (depth, count) bucket.

Bounded: past `max_tokens` indexed tokens in all, the oldest document goes, its table entries with
it. Written by hand: ArcticInference's suffix tree needs torch, and a table of 3-grams over token
arrays does what is needed here in well under a millisecond a step.
"""

from __future__ import annotations

import collections
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from app.engine import kv
from app.engine.drafters.base import Draft, DrafterBase
from app.engine.sampling import SamplingParams
from app.llama import media

KEY = 3  # tokens in a table key
MAX_DEPTH = 32  # a match is measured back this far at most
MAX_OCCURRENCES = 32  # kept per key and partition (the most recent)
MAX_CANDIDATES = 16  # occurrences one proposal measures
AGREEMENT = 0.5  # a drafted token needs this share of the occurrences still agreeing
RECENT_DOCS = 8  # a new prompt's head is looked for in this many recent documents of its partition
DOC = 1 << 32  # a table entry is doc_id * DOC + the offset of the token that followed the key
TOKEN_BITS = 21  # token ids below 2**21 (every vocabulary here: 262,144 at most)
BYTES_PER_TOKEN = 125  # the index's host memory per indexed token (measured: 11.9 MiB per 100K, docs/BENCHMARKS.md)


def _key(a: int, b: int, c: int) -> int:
    return (a << (2 * TOKEN_BITS)) | (b << TOKEN_BITS) | c


@dataclass
class Doc:
    """One request's text. `text[:start]` is the prompt's head that an earlier document already
    indexed; `text[start:]` is indexed. Documents that are no longer recent drop their head
    (`cut` tokens gone from the front; offsets stay absolute)."""

    id: int
    partition: str
    text: array = field(default_factory=lambda: array("i"))
    start: int = 0
    cut: int = 0

    def __len__(self) -> int:
        return self.cut + len(self.text)

    def span(self, a: int, b: int) -> list[int]:
        return self.text[max(a, self.cut) - self.cut: b - self.cut].tolist()

    @property
    def indexed(self) -> int:
        return len(self) - max(self.start, self.cut)


@dataclass
class Match:
    tokens: list[int]
    depth: int = 0  # tokens before the continuation that matched the history
    count: int = 0  # occurrences behind the first token


class SuffixIndex:
    """Recent requests' tokens, by partition, for continuations (see the module's docstring)."""

    def __init__(self, max_tokens: int = 100_000) -> None:
        self.max_tokens = max_tokens
        self.docs: dict[int, Doc] = {}  # insertion order: the oldest first
        self.tables: dict[str, dict[int, list[int]]] = {}
        self.tokens = 0  # indexed tokens in all documents
        self._next_id = 0

    # -- documents --------------------------------------------------------------------------

    def open(self, partition: str, prompt: Sequence[int]) -> Doc:
        """A new document for a request, holding its prompt (indexed from where recent documents of
        the partition stop holding it)."""
        self._next_id += 1
        doc = Doc(self._next_id, partition)
        recent = [d for d in reversed(self.docs.values()) if d.partition == partition and d.cut == 0]
        for old in recent[RECENT_DOCS - 1:]:  # past the recent ones: keep only the indexed text
            self._cut_head(old)
        doc.start = max((kv.common_prefix(d.text, prompt) for d in recent[:RECENT_DOCS - 1]), default=0)
        doc.text.extend(prompt[: doc.start])
        self.docs[doc.id] = doc
        self.extend(doc, prompt[doc.start:])
        self._evict(keep=doc.id)
        return doc

    def _cut_head(self, doc: Doc) -> None:
        keep_from = max(0, doc.start - MAX_DEPTH)  # a match may look back a little into the head
        if keep_from > doc.cut:
            doc.text = doc.text[keep_from - doc.cut:]
            doc.cut = keep_from

    def extend(self, doc: Doc, tokens: Sequence[int]) -> None:
        """Append tokens to a document (a request's output as it is generated) and index them."""
        if len(tokens) == 0 or doc.id not in self.docs:
            return
        table = self.tables.setdefault(doc.partition, {})
        old = len(doc)
        doc.text.extend(media.folded(tokens))  # an image's positions as one sentinel: it fits int32
        t, cut, base = doc.text, doc.cut, doc.id * DOC
        for end in range(max(old, doc.start, cut + KEY, KEY), len(doc)):  # key t[end-3:end] -> t[end]
            i = end - cut
            k = _key(t[i - 3], t[i - 2], t[i - 1])
            occ = table.get(k)
            if occ is None:
                table[k] = [base + end]
            else:
                occ.append(base + end)
                if len(occ) > 2 * MAX_OCCURRENCES:
                    del occ[:-MAX_OCCURRENCES]
        self.tokens += len(tokens)
        self._evict(keep=doc.id)

    def _evict(self, keep: int) -> None:
        """The oldest documents go while the index holds more than its bound (never `keep`)."""
        while self.tokens > self.max_tokens and len(self.docs) > 1:
            self.drop(next(d for d in self.docs if d != keep))

    def drop(self, doc_id: int) -> None:
        """Forget a document and its table entries."""
        doc = self.docs.pop(doc_id, None)
        if doc is None:
            return
        self.tokens -= doc.indexed
        table = self.tables.get(doc.partition, {})
        t, cut = doc.text, doc.cut
        keys = {_key(t[i - 3], t[i - 2], t[i - 1])
                for i in range(max(doc.start, cut + KEY, KEY) - cut, len(t))}
        for k in keys:
            occ = table.get(k)
            if occ is not None:
                occ[:] = [p for p in occ if p // DOC != doc_id]
                if not occ:
                    del table[k]
        if not table:
            self.tables.pop(doc.partition, None)

    def clear(self) -> None:
        self.docs.clear()
        self.tables.clear()
        self.tokens = 0

    def holds(self) -> dict:
        """What the index holds: documents, indexed tokens, partitions."""
        return {"documents": len(self.docs), "tokens": self.tokens, "partitions": len(self.tables)}

    # -- proposals --------------------------------------------------------------------------

    def propose(self, partition: str, history: Sequence[int], k: int) -> Match:
        """Up to k tokens that followed the history's end where it occurred before (see the module)."""
        n = len(history)
        if k <= 0 or n < KEY:
            return Match([])
        occ = self.tables.get(partition, {}).get(_key(history[-3], history[-2], history[-1]))
        if not occ:
            return Match([])
        cands = []  # (depth, continuation)
        tail = array("i", media.folded(history[max(0, n - MAX_DEPTH):]))  # what a match is measured against, from its end
        for p in reversed(occ[-MAX_CANDIDATES:]):
            doc = self.docs.get(p // DOC)
            off = p % DOC
            if doc is None or off >= len(doc):
                continue  # a dropped document, or the history's own end: nothing follows yet
            cands.append((_depth(doc, off, tail), doc.span(off, off + k)))
        if not cands:
            return Match([])
        best = max(d for d, _ in cands)
        return _walk([(d, c) for d, c in cands if 2 * d >= best], k)


def _depth(doc: Doc, off: int, tail: array) -> int:
    """How far back the text before `off` in `doc` equals the end of `tail` (at least KEY, which the
    table matched; at most len(tail)): one comparison in C where the whole tail matches (a copy in
    progress), else token by token from the end."""
    most = min(len(tail), off - doc.cut)
    end = off - doc.cut
    if most > KEY and doc.text[end - most: end - KEY] == tail[len(tail) - most: len(tail) - KEY]:
        return most
    depth = KEY
    while depth < most and doc.text[end - depth - 1] == tail[-depth - 1]:
        depth += 1
    return depth


def _walk(cands: list[tuple[int, list[int]]], k: int) -> Match:
    """The continuation most of the (depth, continuation) candidates agree on, token by token; its
    depth is that of the deepest candidate behind its first token."""
    out: list[int] = []
    count = depth = 0
    for j in range(k):
        votes = collections.Counter(c[j] for _, c in cands if len(c) > j)
        if not votes:
            break
        token, n = votes.most_common(1)[0]
        if n < AGREEMENT * len(cands):
            break
        cands = [(d, c) for d, c in cands if len(c) > j and c[j] == token]
        if j == 0:
            count, depth = n, max(d for d, _ in cands)
        out.append(token)
    return Match(out, depth, count)


def suffix_key(depth: int, count: int) -> str:
    """Acceptance is learned per match depth (3-7 exactly, then 8-15, 16-31, 32) and support (the
    occurrences behind the first token: 1, 2-3, 4+): a deep match many earlier texts agree on is a
    copy in progress; a shallow one seen once may be chance."""
    d = depth if depth < 8 else 1 << (depth.bit_length() - 1)
    c = 1 if count <= 1 else 2 if count <= 3 else 4
    return f"suffix-{min(d, 32)}-{c}"


SUFFIX_PRIORS = {f"suffix-{d}-{c}": 0.9 for d in (16, 32) for c in (1, 2, 4)}


class SuffixDrafter(DrafterBase):
    """Drafts from `SuffixIndex`: each sequence's request is a document of its partition, kept in
    step with the sequence's history (the prompt at the first call, then each kept token)."""

    name = "suffix"

    def __init__(self, index: SuffixIndex | None = None) -> None:
        self.index = index if index is not None else SuffixIndex()
        self._seq: dict[int, tuple[str, Doc | None]] = {}
        self._private: set[int] = set()  # sequences whose request keeps out of the index

    def begin_request(self, seq: int, partition: str | None = "") -> None:
        if partition is None:  # the request keeps out of the index: it neither reads nor joins it
            self._seq.pop(seq, None)
            self._private.add(seq)
        else:
            self._private.discard(seq)
            self._seq[seq] = (partition, None)

    def sync(self, seq: int, history: Sequence[int]) -> tuple[str, Doc]:
        """The sequence's document, extended with what its history gained since the last call."""
        partition, doc = self._seq.get(seq, ("", None))
        if doc is None or doc.id not in self.index.docs or len(doc) > len(history):
            doc = self.index.open(partition, history)
        elif len(doc) < len(history):
            self.index.extend(doc, history[len(doc):])
        self._seq[seq] = (partition, doc)
        return partition, doc

    def match(self, seq: int, history: Sequence[int], k: int) -> Match:
        if seq in self._private:
            return Match([])
        partition, _ = self.sync(seq, history)
        return self.index.propose(partition, history, k)

    def propose(self, seq: int, history: Sequence[int], k: int, sampling: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        m = self.match(seq, history, k)
        return Draft(m.tokens, None, source=self.name, match_len=m.depth, support=m.count)

    def finish_request(self, seq: int, history: Sequence[int]) -> None:
        if seq in self._seq and seq not in self._private:
            self.sync(seq, history)

    def release(self, seq: int) -> None:
        self._seq.pop(seq, None)  # the document stays in the index: it is a recent request now
        self._private.discard(seq)

    def host_bytes(self) -> int:
        return self.index.tokens * BYTES_PER_TOKEN
