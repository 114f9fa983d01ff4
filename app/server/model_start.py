"""What one model's start serves: its name, plan and files (a light module: the commands name it
before anything of the server is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.gguf.info import ModelInfo
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


@dataclass(frozen=True)
class Resolved:
    """What a start serves (the model, planned) and the machine it was planned for."""

    model: ModelStart
    hw: Hardware
