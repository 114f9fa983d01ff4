"""What one model's start serves: its name, plan and files (a light module: the commands name it
before anything of the server is imported)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.chat.fallback import origin
from app.gguf.info import ModelInfo
from app.drafting.kind import DrafterKind
from app.ops.alerts import AlertSettings
from app.plan.hardware import Hardware
from app.plan.planner import Plan


@dataclass(frozen=True)
class ModelStart:
    """One model as a start serves it: its name, plan and files. `serve`, `up` and `validate`'s own
    server all start it the same way: `open_service` (the service, whole, answering 503), `load_model`,
    then `go_live`."""

    name: str
    plan: Plan
    target: ModelInfo
    draft: ModelInfo | None
    embedder: ModelInfo | None = None
    chat_template: str | None = None  # in place of the target's own (--chat-template-file, the preset's)
    mmproj: Path | None = None  # the target's vision projector
    aliases: tuple[str, ...] = ()  # other names requests may give it
    unload_after: float | None = None  # seconds idle before it unloads (None: kept loaded)
    head: DrafterKind | None = None  # the drafter on the target's own model the plan has rows for (its MTP head)

    @property
    def template_origin(self) -> str:
        """Where its chat template comes from: "model", "file" or the fallback's name (app/chat/fallback.py)."""
        return origin(self.chat_template, self.target.vocab.chat_template if self.target is not None else None)


@dataclass(frozen=True)
class Resolved:
    """What a start serves (its models, planned; the first is the default's or the first named) and
    the machine it was planned for."""

    models: tuple[ModelStart, ...]
    hw: Hardware

    @property
    def model(self) -> ModelStart:
        return self.models[0]


@dataclass
class Start:
    """How one start is judged and reported (the command supplies it; everything optional)."""

    alerts: AlertSettings | None = None
    baseline_acceptance: float | None = None
    on_good: Callable[[], None] | None = None  # called once healthy and the smoke request passed
    timeout: float = 900.0  # seconds to become good, else the start failed
    revision: int | None = None
    machine: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)
    status_line: str = ""  # appended to systemd's STATUS= (e.g. the fallback that led here)
    plan: dict | None = None  # the plan this start serves (recorded with the revision)
    fallback: dict | None = None  # {"from": revision, "reason": ...} when this start stands in for a failed one
