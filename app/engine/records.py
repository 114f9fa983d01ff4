"""One typed record per step and per request: read by the API, /metrics, the dashboard, benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class StepRecord:
    slot: int
    tokens: list[int]  # emitted this step
    drafted: int
    accepted: int
    k: int  # draft length asked for
    drafter: str
    t_draft: float
    t_verify: float
    t_sample: float
    # filled when tracing (greedy checks): the target's argmax and top-2 logit gap at each emitted token
    target_argmax: list[int] | None = None
    top2_gap: list[float] | None = None
    finish_reason: str | None = None
    logprobs: list | None = None  # TokenLogprob per emitted token, when the request asks for them
    # the drafter's reasons, when it estimated (the adaptive drafter's controller)
    alpha_est: float | None = None
    expected_gain: float | None = None
    reason: str = ""
    depth: int = 0  # context tokens the slot held before this step (an MTP head's acceptance is kept per depth band)

    @classmethod
    def undrafted(cls, slot: int, tokens: list[int], t_verify: float = 0.0, finish_reason: str | None = None) -> StepRecord:
        """A step with no draft: a request's first token (or none), or a slot ended without a step."""
        return cls(slot=slot, tokens=tokens, drafted=0, accepted=0, k=0, drafter="none", t_draft=0.0,
                   t_verify=t_verify, t_sample=0.0, finish_reason=finish_reason)


@dataclass
class RequestRecord:
    prompt_tokens: int
    reused_tokens: int = 0
    completion: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    target_decodes: int = 0
    t_prompt: float = 0.0
    t_generate: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_sample: float = 0.0
    ttft: float = 0.0
    finish_reason: str | None = None
    logprobs: list = field(default_factory=list)  # TokenLogprob per completion token, when asked
    drafters: dict[str, int] = field(default_factory=dict)  # tokens drafted, by the drafter that drafted them

    def add(self, step: StepRecord) -> None:
        self.completion += step.tokens
        if step.logprobs:
            self.logprobs += step.logprobs
        self.drafted += step.drafted
        self.accepted += step.accepted
        if step.drafted:
            self.drafters[step.drafter] = self.drafters.get(step.drafter, 0) + step.drafted
        self.target_decodes += 1
        self.t_draft += step.t_draft
        self.t_verify += step.t_verify
        self.t_sample += step.t_sample

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_decode(self) -> float | None:
        return len(self.completion) / self.target_decodes if self.target_decodes else None

    @property
    def prompt_tps(self) -> float | None:
        evaluated = self.prompt_tokens - self.reused_tokens
        return evaluated / self.t_prompt if self.t_prompt > 0 else None

    @property
    def generation_tps(self) -> float | None:
        return len(self.completion) / self.t_generate if self.t_generate > 0 else None
