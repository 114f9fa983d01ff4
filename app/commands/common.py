"""What the commands share: the catalogue and selection from the flags, the fetcher, model headers
(local, else the hub's), the server settings and the plan request. No command module imports the CLI."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from app.errors import DownloadError, SpecdeckError
from app.gguf.info import ModelInfo, read_model_info
from app.models.catalog import Catalog, load_catalog
from app.models.fetch import Fetched, Fetcher
from app.commands.start_request import Chosen, fixed_plan, planned
from app.commands.start_request import plan_request_of as plan_request_of  # the commands import it from here
from app.gguf.projector import ProjectorInfo, fits, read_projector
from app.models.refs import ModelRef, Selection, resolve_ref, select, with_mmproj
from app.plan.hardware import default_preset_reason, detect
from app.plan.planner import PlanRequest
from app.server.settings import ServeSettings
from app.settings import given, hub_settings, paths

console = Console(stderr=True, highlight=False)
out = Console(highlight=False)


def catalog_from_args(args: argparse.Namespace) -> Catalog:
    return catalog_of(args.models)


def catalog_of(models: str | None) -> Catalog:
    """The catalogue: --models FILE, else the default places (see load_catalog)."""
    return load_catalog(Path(models) if models else None)


def default_preset(catalog: Catalog) -> str:
    gpu, why = default_preset_reason(detect())
    name = catalog.default_gpu_preset if gpu else catalog.default_cpu_preset
    console.print(f"[dim]preset {name}: {why}[/]")
    return name


def make_selection(args: argparse.Namespace, catalog: Catalog) -> Selection:
    return selection_of(Chosen.of(args), catalog)


def selection_of(chosen: Chosen, catalog: Catalog) -> Selection:
    """What a start serves (a Chosen: as the user named it), resolved against the catalogue: the one
    place model names become files."""
    sel = select(catalog, chosen.name, chosen.target, chosen.draft, lambda: default_preset(catalog))
    return with_mmproj(sel, chosen.mmproj, chosen.no_mmproj, catalog)


def roles_of(sel: Selection, chosen: Chosen, speculative: bool, catalog: Catalog) -> list[tuple[str, ModelRef]]:
    """The files a start of `sel` needs, by role: the target, the draft model (when speculating), the
    embedding model (--embedding-model, else the preset's) and the vision projector."""
    embedding = resolve_ref(chosen.embedding_model, catalog) if chosen.embedding_model else sel.embedding
    return ([("target", sel.target)] + ([("draft", sel.draft)] if sel.draft and speculative else [])
            + ([("embedding", embedding)] if embedding is not None else [])
            + ([("mmproj", sel.mmproj)] if sel.mmproj is not None else []))


def make_fetcher(offline: bool, verify: bool = False) -> Fetcher:
    """`offline`: use only what is on disk; `verify`: re-hash files even where a record vouches for them."""
    return Fetcher(paths(), hub_settings(), console, offline=offline, force_verify=verify)


def pull_one(fetcher: Fetcher, ref: ModelRef) -> Fetched:
    if ref.path is not None:
        return fetcher.local(ref.path)
    assert ref.spec is not None
    console.print(f"[bold]{ref.spec.name}[/]: {ref.spec.label}")
    return fetcher.ensure(ref.spec)


def local_path(fetcher: Fetcher, ref: ModelRef) -> Path:
    """A file to inspect: the user's own path, or a verified copy of a catalogue model already pulled."""
    if ref.path is not None:
        if not ref.path.is_file():
            raise SpecdeckError(f"{ref.path}: no such file")
        return ref.path
    assert ref.spec is not None
    got = fetcher.existing(ref.spec)
    if got is None:
        raise DownloadError(f"{ref.spec.name} is not on disk", hint=f"run `specdeck pull {ref.spec.name}` first")
    return got.path


def model_info(fetcher: Fetcher, ref: ModelRef) -> ModelInfo:
    """The model's header: the local file, else (a catalogue model not pulled yet) read from the hub."""
    if ref.path is not None or ref.spec is None:
        return read_model_info(local_path(fetcher, ref))
    info, how = fetcher.header_info(ref.spec)
    if how != "on disk":
        console.print(f"[dim]{ref.spec.name}: not pulled yet; planned from its {how}[/]", soft_wrap=True)
    return info


def fitting_projector(path: Path, target: ModelInfo) -> ProjectorInfo:
    """A projector file's header, refused in one line where it does not fit the target."""
    info = read_projector(path)
    if why := fits(info, target.n_embd):
        raise SpecdeckError(f"--mmproj: {why}", hint="name the projector made for this model, or --no-mmproj")
    return info


def projector(fetcher: Fetcher, sel: Selection, target: ModelInfo, need: bool = False) -> ProjectorInfo | None:
    """The selection's vision projector header (None without one), refused in one line where it does
    not fit the target. One not on disk: an error where it is needed (loading it), else None with a
    line saying the plan leaves it out."""
    if sel.mmproj is None:
        return None
    try:
        return fitting_projector(local_path(fetcher, sel.mmproj), target)
    except DownloadError:
        if need:
            raise
        console.print(f"[yellow]warning:[/] the vision projector {sel.mmproj.label} is not on disk: this plan leaves it "
                      "out (`specdeck pull` fetches it; --no-mmproj serves text only)", soft_wrap=True)
        return None


def config_path(args: argparse.Namespace) -> Path:
    """The config file: `--config FILE`, else ~/.config/specdeck/config.toml (which may not exist)."""
    given_ = getattr(args, "config", None)
    return Path(given_) if given_ else paths().config_dir / "config.toml"


def threads(asked: int | None, hw) -> int:
    """CPU threads: as asked (`--threads`, `threads` in the config, SPECDECK_THREADS), else the
    machine's physical cores."""
    return asked or hw.cpu_count


def template_file(args: argparse.Namespace) -> Path | None:
    """`--chat-template-file`, else `chat_template_file` in the config file (or SPECDECK_CHAT_TEMPLATE_FILE),
    for the commands that take no other server setting (check, bench, verify): as `serve` reads it."""
    return serve_settings(args, check=False).chat_template_file


def chat_template(asked: Path | None, sel, target=None) -> str | None:
    """The chat template in place of the target's own: --chat-template-file (or `chat_template_file` in
    the config), else the preset's; read and proved to compile now. Else, for a target with no template
    of its own (`target`: its ModelInfo), ChatML (app/chat/fallback.py). None: the target's own."""
    from app.chat.fallback import served_template
    from app.chat.template import read_template

    path = asked or getattr(sel, "chat_template_file", None)
    given = read_template(path) if path is not None else None
    return given if target is None else served_template(given, target.vocab.chat_template)


def serve_settings(args: argparse.Namespace, check: bool = True, use_config: bool = True) -> ServeSettings:
    """Server settings: config file, then SPECDECK_* variables, then the flags given (serve, up, run,
    doctor, validate; the flags are ServeSettings' own fields). `check=False` (doctor) reports an
    unsafe exposure or a bad key file as a check instead of refusing."""
    from app.server.settings import load_settings

    config = config_path(args)
    settings = load_settings(config if use_config and (getattr(args, "config", None) or config.exists()) else None,
                             given(args, ServeSettings))
    if check:
        settings.check()
    return settings


def alert_settings(args: argparse.Namespace):
    """Alert thresholds: the config file's [alerts] table, then SPECDECK_ALERT_*, then --alert-* flags."""
    from app.ops.alerts import AlertSettings
    from app.server.settings import load_settings

    config = config_path(args)
    return load_settings(config if config.exists() else None, given(args, AlertSettings, "alert"), AlertSettings, "alerts")


def plan_request(args: argparse.Namespace, **more) -> PlanRequest:
    """A PlanRequest from the planner flags given (PlanRequest's own fields; `--cache-type` sets both
    K and V), plus what the command adds."""
    return planned(fixed_plan(args), **more)
