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


class NamedModel(BaseModel):
    """One of several models a server serves (`--model NAME=PRESET|FILE`, the config's [models.NAME]):
    what it is, the planner's inputs fixed for it alone, and how it is kept loaded."""

    name: str
    chosen: Chosen
    plan: dict = {}  # PlanRequest fields for this model (over the command's own)
    unload_after: float | None = None  # seconds idle before it unloads (None: the server's --unload-after)
    aliases: list[str] = []


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
    models: list[NamedModel] = []  # several models, by name (none: the one `chosen` names)

    @classmethod
    def of(cls, args: argparse.Namespace, settings: ServeSettings, alerts: AlertSettings | None = None,
           config: Path | None = None) -> StartRequest:
        return cls(chosen=Chosen.of(args), plan=fixed_plan(args), up=UpOptions.of(args), settings=settings,
                   alerts=alerts, config=config, config_given=bool(getattr(args, "config", None)),
                   max_tokens=getattr(args, "max_tokens", None),
                   models=named_models(getattr(args, "model", None) or [], config, Chosen.of(args)))

    def plan_request(self, **more) -> PlanRequest:
        return planned(self.plan, **more)

    def model_plan_request(self, named: NamedModel, **more) -> PlanRequest:
        """The planner's request for one of several models: the command's inputs, then its own."""
        return planned({**self.plan, **named.plan}, **more)


def served(req: StartRequest) -> list[NamedModel]:
    """The models a start serves, by name: those named with --model / [models.NAME], else the one
    the selection names (served under its preset's name, with the server's aliases)."""
    if req.models:
        default = req.settings.default_model
        if default is not None and default not in (names := [m.name for m in req.models]):
            raise SpecdeckError(f"--default-model {default} is not one of the models served ({', '.join(names)})")
        return list(ordered(req.models, default))
    return [NamedModel(name="", chosen=req.chosen, aliases=req.settings.model_aliases)]


def ordered(models: list[NamedModel], default: str | None) -> list[NamedModel]:
    """The default model first (the one a start loads first and answers for the others' names)."""
    return sorted(models, key=lambda m: m.name != default)


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


# what a [models.NAME] section may say besides the planner's inputs (PlanRequest's fields)
SECTION_KEYS = {"model", "draft", "mmproj", "no_mmproj", "embedding_model", "unload_after", "aliases"}


def named_models(flags: list[str], config: Path | None, common: Chosen) -> list[NamedModel]:
    """The models named by `--model NAME=PRESET|FILE` (repeated) and the config file's [models.NAME]
    sections, in that order (a flag names the model of a section of the same name; a section alone
    is served too). One line for anything that does not parse."""
    sections = config_sections(config)
    named: dict[str, str | None] = {}
    for flag in flags:
        name, sep, what = flag.partition("=")
        if not sep or not name.strip() or not what.strip():
            raise SpecdeckError(f"--model {flag}: expected NAME=PRESET|FILE", hint="e.g. --model coder=coder-1.5b")
        if name.strip() in named:
            raise SpecdeckError(f"--model {name.strip()} is named twice")
        named[name.strip()] = what.strip()
    for name in sections:
        named.setdefault(name, None)
    given = [k for k in ("name", "target", "draft", "mmproj", "embedding_model") if getattr(common, k)]
    if named and given:
        where = "--model" if flags else f"{config}'s [models.NAME] sections"
        raise SpecdeckError(f"models are named both by {where} and by {'the preset name' if given[0] == 'name' else '--' + given[0].replace('_', '-')}",
                            hint="name every model with --model NAME=PRESET|FILE (or in a [models.NAME] section), or "
                                 "serve one model without them (--config with no [models] table)")
    return [named_model(name, what, sections.get(name, {}), common) for name, what in named.items()]


def config_sections(config: Path | None) -> dict[str, dict]:
    import tomllib

    if config is None or not config.exists():
        return {}
    try:
        raw = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SpecdeckError(f"{config}: cannot read config: {e}") from None
    models = raw.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
        raise SpecdeckError(f"{config}: [models] holds a section per model ([models.NAME])")
    return models


def named_model(name: str, what: str | None, section: dict, common: Chosen) -> NamedModel:
    from app.units import parse_duration

    where = f"[models.{name}]"
    unknown = sorted(set(section) - SECTION_KEYS - set(PlanRequest.model_fields))
    if unknown:
        raise SpecdeckError(f"{where}: unknown key {unknown[0]}",
                            hint=f"a model's section takes {', '.join(sorted(SECTION_KEYS))} and the planner's settings (ctx, parallel, cache_type ...)")
    what = what or section.get("model")
    if not what:
        raise SpecdeckError(f"{where}: no model", hint=f'give it with --model {name}=PRESET|FILE or model = "..." in the section')
    file_like = what.endswith(".gguf") or "/" in what and not what.startswith("hf://")
    draft = section.get("draft")
    chosen = Chosen(**{"target" if file_like or (draft and draft != "mtp") else "name": what, "draft": draft,
                       "mmproj": section.get("mmproj"), "no_mmproj": bool(section.get("no_mmproj", False)),
                       "embedding_model": section.get("embedding_model"), "models": common.models})
    plan = {k: v for k, v in section.items() if k in PlanRequest.model_fields}
    try:
        plan_request_of(**plan)
        unload = section.get("unload_after")
        after = None if unload is None else parse_duration(str(unload))
        return NamedModel(name=name, chosen=chosen, plan=plan, unload_after=after, aliases=list(section.get("aliases", [])))
    except SpecdeckError as e:
        raise SpecdeckError(f"{where}: {e.message}", hint=e.hint) from None
    except ValidationError as e:
        raise SpecdeckError(f"{where}: {e.errors()[0]['msg']}") from None
