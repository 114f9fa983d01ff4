"""What a user may name as a model: a catalogue model, an `hf://` URI, or a GGUF path on disk."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from app.errors import CatalogError
from app.models.catalog import MTP, Catalog, ModelSpec

HF_URI = re.compile(r"^hf://(?P<repo>[^/@\s]+/[^/@\s]+)/(?P<file>[^@\s]+?)(?:@(?P<rev>[^@\s/]+))?$")


@dataclass(frozen=True)
class ModelRef:
    """Exactly one of `spec` (fetched and verified by specdeck) or `path` (the user's own file)."""

    spec: ModelSpec | None = None
    path: Path | None = None

    @property
    def label(self) -> str:
        return self.spec.name if self.spec else str(self.path)


def parse_hf_uri(text: str) -> ModelSpec:
    m = HF_URI.match(text)
    if not m:
        raise CatalogError(f"bad hub reference '{text}'", hint="use hf://owner/repo/file.gguf or hf://owner/repo/file.gguf@revision")
    if not m["file"].endswith(".gguf"):
        raise CatalogError(f"'{text}' does not name a .gguf file")
    return ModelSpec(name=text, repo=m["repo"], file=m["file"], revision=m["rev"] or "main")


def resolve_ref(text: str, catalog: Catalog) -> ModelRef:
    if text.startswith("hf://"):
        return ModelRef(spec=parse_hf_uri(text))
    if text in catalog.models:
        return ModelRef(spec=catalog.models[text])
    path = Path(text).expanduser()
    if path.exists() or text.endswith(".gguf") or "/" in text:
        return ModelRef(path=path)
    raise CatalogError(
        f"'{text}' is not a catalogue model, an hf:// URI or a file",
        hint=f"catalogue models: {', '.join(sorted(catalog.models))}",
    )


@dataclass(frozen=True)
class Selection:
    """A target and an optional draft, from a preset or named one by one."""

    name: str
    target: ModelRef
    draft: ModelRef | None
    context: int | None = None
    embedding: ModelRef | None = None  # an optional embedding model served beside the pair
    chat_template_file: Path | None = None  # the preset's chat template in place of the target's own
    mtp: bool = False  # the target's own MTP (nextn) head drafts (--draft mtp), no draft model
    mmproj: ModelRef | None = None  # the target's vision projector (images in), None: text only


def with_mmproj(sel: Selection, asked: str | None, off: bool, catalog: Catalog) -> Selection:
    """The selection with its projector as asked: --mmproj FILE|MODEL names one, --no-mmproj leaves
    it out, neither keeps the preset's."""
    if asked and off:
        raise CatalogError("give --mmproj or --no-mmproj, not both")
    if off:
        return replace(sel, mmproj=None)
    return replace(sel, mmproj=resolve_ref(asked, catalog)) if asked else sel


def select(
    catalog: Catalog, name: str | None, target: str | None, draft: str | None, default: Callable[[], str]
) -> Selection:
    """Turn `NAME` or `--target/--draft` into a Selection. NAME may be a preset, a model or hf:// URI.
    `--draft mtp` drafts with the target's own MTP head: with --target, or with NAME (a preset's draft
    model is then not used)."""
    mtp = draft == MTP
    if name and (target or draft) and not (mtp and not target):
        raise CatalogError("give either a preset name or --target/--draft, not both",
                           hint="--draft mtp may go with a preset name")
    if target:
        return Selection("custom", resolve_ref(target, catalog), resolve_ref(draft, catalog) if draft and not mtp else None,
                         mtp=mtp)
    if draft and not mtp:
        raise CatalogError("--draft needs --target")
    name = name or default()
    if name in catalog.presets:
        p = catalog.presets[name]
        mtp = mtp or p.draft == MTP
        return Selection(
            name,
            ModelRef(spec=catalog.models[p.target]),
            ModelRef(spec=catalog.models[p.draft]) if p.draft and not mtp else None,
            p.context,
            ModelRef(spec=catalog.models[p.embedding]) if p.embedding else None,
            catalog.source.parent / p.chat_template_file if p.chat_template_file else None,
            mtp=mtp,
            mmproj=ModelRef(spec=catalog.models[p.mmproj]) if p.mmproj else None,
        )
    if name in catalog.models or name.startswith("hf://"):
        return Selection(name, resolve_ref(name, catalog), None, mtp=mtp)
    raise CatalogError(f"unknown preset '{name}'", hint=f"known presets: {', '.join(sorted(catalog.presets))}")
