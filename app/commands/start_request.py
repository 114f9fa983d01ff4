"""A start of `serve`, `up`, `run` or `validate`'s own server, typed: what is served as the user named
it, the planner's inputs they fixed, `up`'s options, and the effective settings. It is made once at
the command's edge (`StartRequest.of`) or from a recorded revision (`StartRequest.of_record`);
nothing past it reads argparse's Namespace."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import BaseModel, ValidationError

from app.errors import SpecdeckError
from app.ops.alerts import AlertSettings
from app.plan.planner import PlanRequest
from app.server.settings import ServeSettings
from app.settings import given


class Chosen(BaseModel):
    """What a start serves, as the user named it (resolved against the catalogue at each start)."""

    name: str | None = None
    target: str | None = None
    draft: str | None = None
    mmproj: str | None = None
    no_mmproj: bool = False
    embedding_model: str | None = None
    models: str | None = None  # the catalogue file (--models)

    @classmethod
    def of(cls, args: argparse.Namespace) -> Chosen:
        return cls(**{k: v for k in cls.model_fields if (v := getattr(args, k, None)) is not None})


class UpOptions(BaseModel):
    """`up`'s own options (its dashboard, and whether it re-hashes or stays offline)."""

    offline: bool = False
    verify: bool = False
    interval: float = 1.0
    log_interval: float = 10.0

    @classmethod
    def of(cls, args: argparse.Namespace) -> UpOptions:
        return cls(**{k: v for k in cls.model_fields if (v := getattr(args, k, None)) is not None})


def fixed_plan(args: argparse.Namespace) -> dict:
    """The planner's inputs the flags fixed (PlanRequest fields), as a revision records them."""
    asked = given(args, PlanRequest)
    return plan_request_of(**asked).model_dump(mode="json", include=set(asked) - {"ctx_is_user_choice"})


class StartRequest(BaseModel):
    chosen: Chosen = Chosen()
    plan: dict = {}  # the planner's inputs the user fixed (PlanRequest fields; absent: the planner chooses)
    up: UpOptions = UpOptions()
    settings: ServeSettings
    alerts: AlertSettings | None = None  # the alert thresholds (None: no alerts watched)
    config: Path | None = None  # the config file the settings were read from
    config_given: bool = False  # named with --config (not found in the default place)
    max_tokens: int | None = None  # `run`'s answers

    @classmethod
    def of(cls, args: argparse.Namespace, settings: ServeSettings, alerts: AlertSettings | None = None,
           config: Path | None = None) -> StartRequest:
        return cls(chosen=Chosen.of(args), plan=fixed_plan(args), up=UpOptions.of(args), settings=settings,
                   alerts=alerts, config=config, config_given=bool(getattr(args, "config", None)),
                   max_tokens=getattr(args, "max_tokens", None))

    def plan_request(self, **more) -> PlanRequest:
        return planned(self.plan, **more)


def planned(fixed: dict, **more) -> PlanRequest:
    """The planner's request: what the user fixed (fixed_plan), plus what the command adds."""
    values = {**PlanRequest(**fixed).model_dump(include=set(fixed)), **{k: v for k, v in more.items() if v is not None}}
    return plan_request_of(**values, ctx_is_user_choice=values.get("ctx") is not None)


def plan_request_of(**values) -> PlanRequest:
    """A PlanRequest, or one line naming the setting that is out of bounds (--parallel 0, --draft-max 99)."""
    try:
        return PlanRequest(**values)
    except ValidationError as e:
        first = e.errors()[0]
        raise SpecdeckError(f"bad setting {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
