"""The parameters one llama.cpp model and context are created with: what a plan fixes and
`llama.context.Context` applies."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelParams:
    """The llama.cpp parameters one model is created with."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    kv_unified: bool
    type_k: str
    type_v: str
    flash_attn: bool
    swa_full: bool
    n_rs_seq: int
    n_gpu_layers: int
    embeddings: bool = False  # a pooled embedding context (no logits)
    # the most logits rows one decode asks for (0: n_batch): llama.cpp sizes the compute buffer's
    # output layer for this many, as llama-server does (n_parallel x (1 + n_draft) on its target)
    n_outputs_max: int = 0

    def with_rows(self, n: int) -> ModelParams:
        """The same context, able to give at least n logits rows in one decode (an uncapped one is)."""
        if not self.n_outputs_max or self.n_outputs_max >= n:
            return self
        return replace(self, n_outputs_max=n)
