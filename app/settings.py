"""Where specdeck keeps things, read from the environment at the moment they are needed."""

from __future__ import annotations

import argparse
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, SettingsConfigDict


def _xdg(var: str, default: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / default)


class Paths(BaseSettings):
    """Directories and files. Every field can be set by an environment variable `SPECDECK_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="SPECDECK_")

    home: Path = Field(
        default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache") / "specdeck",
        description="specdeck's cache: mirror-assembled models, verification records, staging.",
    )
    config_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_CONFIG_HOME", ".config") / "specdeck",
        description="specdeck's configuration directory.",
    )
    models_file: Path | None = Field(
        default=None,
        description="The model catalogue (models.toml). Default: the one shipped with specdeck.",
    )
    state_dir: Path | None = Field(
        default=None,
        description="Where revisions, baselines and the chat page's conversations are written. Default: "
                    "SPECDECK_HOME/state (apart, the home may be read-only: a Kubernetes weights volume).",
    )
    costs_dir: Path | None = Field(
        default=None,
        description="Where a start keeps the speculation costs it measured, for the next start of the same "
                    "models, plan, build and machine. Default: the state folder's costs/.",
    )

    @property
    def store(self) -> Path:
        """Models assembled from mirrors, one folder per SHA-256."""
        return self.home / "models"

    @property
    def staging(self) -> Path:
        return self.home / "staging"

    @property
    def verified_file(self) -> Path:
        return self.home / "verified.json"

    @property
    def headers(self) -> Path:
        """GGUF headers read from the hub before a download, one file per ETag."""
        return self.home / "headers"

    @property
    def state(self) -> Path:
        """Configuration revisions, validation baselines and the chat page's conversations."""
        return self.state_dir or self.home / "state"

    @property
    def costs(self) -> Path:
        """Speculation costs measured at start, one file per models, plan, build and machine."""
        return self.costs_dir or self.state / "costs"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"


class HubSettings(BaseSettings):
    """How the Hugging Face hub is reached. Reads the hub's own variables (HF_ENDPOINT, HF_TOKEN ...)."""

    model_config = SettingsConfigDict(env_prefix="HF_")

    endpoint: str = Field(default="https://huggingface.co", description="HF_ENDPOINT")
    token: str | None = Field(default=None, description="HF_TOKEN")
    home: Path = Field(default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache") / "huggingface")
    hub_cache: Path | None = Field(default=None, description="HF_HUB_CACHE")
    hub_offline: bool = Field(default=False, description="HF_HUB_OFFLINE")
    hub_etag_timeout: float = Field(
        default=5.0, description="seconds to wait for the hub to answer before trying the next source"
    )

    @property
    def cache_dir(self) -> Path:
        return self.hub_cache or self.home / "hub"


def paths() -> Paths:
    return Paths()


def hub_settings() -> HubSettings:
    return HubSettings()


# -- flags derived from settings models ---------------------------------------------------------
# A settings model's field is the one source of a setting: its flag, its SPECDECK_* variable (for
# BaseSettings) and its config-file key all come from the field, with its description as the help.
# Every field is a flag of the commands that take the model, but for what its json_schema_extra says:
#   {"flag": "--cors-origin"}  the flag's name;          {"flag": False}  never a flag (a secret);
#   {"negate": True}           a bool field's --no-... flag, which sets it False;
#   {"only": True}             a flag only where a command names the field (plan's budget inputs);
#   {"size": True}             the flag takes a size as users write it (24GiB, 512MiB);
#   {"duration": True}         the flag takes a duration (300, 90s, 5m, 1h30m).

def _extra(field) -> dict:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def _flag_type(annotation) -> type:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        return _flag_type(args[0])
    if typing.get_origin(annotation) is list:
        return list
    if typing.get_origin(annotation) is typing.Literal and all(isinstance(a, int) for a in args):
        return int  # Literal[-1, 0]: the flag's text read as the number it names
    return annotation if annotation in (int, float, str, bool) else str


def _flag_choices(annotation) -> list[str] | None:
    """A Literal field's values (argparse then names them in the error for any other)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        return _flag_choices(args[0])
    if typing.get_origin(annotation) is not typing.Literal:
        return None
    return list(args) if all(isinstance(a, int) for a in args) else [str(a) for a in args]


def flag_fields(model: type[BaseModel]) -> list[str]:
    """The fields of `model` every command that takes the model has as flags."""
    return [name for name, f in model.model_fields.items() if _extra(f).get("flag", True) is not False
            and not _extra(f).get("only")]


def add_flags(parser: argparse.ArgumentParser, model: type[BaseModel], names: Sequence[str] | None = None,
              prefix: str = "", defaults: dict | None = None) -> None:
    """Add `--field-name` flags for these fields of `model` (`--<prefix>-field-name` with a prefix;
    all of `flag_fields(model)` when no names are given). A flag not given leaves None, so the
    config file, the environment and the field's default apply (see `given`), unless `defaults` gives
    this command's own default for it."""
    from app.units import parse_duration, parse_size

    defaults = defaults or {}
    for name in flag_fields(model) if names is None else names:
        field = model.model_fields[name]
        extra = _extra(field)
        flag = str(extra.get("flag") or "--" + (prefix + "_" + name if prefix else name).replace("_", "-"))
        kind = parse_size if extra.get("size") else parse_duration if extra.get("duration") else _flag_type(field.annotation)
        default = defaults.get(name, field.get_default(call_default_factory=False))
        unset = default is PydanticUndefined or default in (None, [], False)
        shown = "" if unset or kind is bool else f" (default {default})"
        metavar = flag.lstrip("-").upper().replace("-", "_")
        dest = prefix + "_" + name if prefix else name
        help_ = str(extra.get("help") or field.description or name)
        if name in defaults:  # this command's own default replaces what the field says of its default
            help_ = re.sub(r"\s*\(default: [^)]*\)$", "", help_)
        help_ += shown
        given_default = defaults.get(name)
        if kind is bool:
            parser.add_argument(flag, dest=dest, action="store_const", const=not extra.get("negate"), default=None, help=help_)
        elif kind is list:
            parser.add_argument(flag, dest=dest, action="append", default=None, metavar=metavar, help=help_ + " (repeatable)")
        else:
            choices = _flag_choices(field.annotation)
            parser.add_argument(flag, dest=dest, type=kind, default=given_default, metavar=metavar if choices is None else None,
                                choices=choices, help=help_)


def given(args: argparse.Namespace, model: type[BaseModel], prefix: str = "") -> dict:
    """The flags of `model`'s fields that the user gave (added with this `prefix`)."""
    lead = prefix + "_" if prefix else ""
    return {k[len(lead):]: v for k, v in vars(args).items()
            if k.startswith(lead) and k[len(lead):] in model.model_fields and v is not None}
