"""`specdeck check`: both headers side by side, and whether the draft can serve the target."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from app.commands.common import (
    catalog_from_args,
    chat_template,
    local_path,
    make_fetcher,
    make_selection,
    out,  # noqa: E402
    template_file,
)
from app.chat.fallback import FALLBACK
from app.chat.fallback import NOTE as FALLBACK_NOTE
from app.chat.fallback import origin as template_origin
from app.errors import GGUFError, PairError
from app.gguf.projector import fits, read_projector
from app.gguf.info import ModelInfo, read_model_info
from app.gguf.pairing import (
    Incompatibility,
    first_incompatibility,
    resolve_vocab,
    speed_warnings,
)
from app.gguf.vocab_probe import VocabFacts, probe_vocab


@dataclass(frozen=True)
class Inspected:
    info: ModelInfo
    facts: VocabFacts | None  # None when the llama.cpp probe was not run


@dataclass(frozen=True)
class CheckResult:
    target: Inspected
    draft: Inspected | None
    incompatibility: Incompatibility | None
    warnings: list[str] = field(default_factory=list)

    @property
    def compatible(self) -> bool:
        return self.incompatibility is None


def inspect(path: Path, probe: bool = True) -> Inspected:
    info = read_model_info(path)
    return Inspected(info, probe_vocab(path) if probe else None)


def check_pair(target: Path, draft: Path | None, probe: bool = True, mtp: bool = False) -> CheckResult:
    """The target (and draft) headers and whether the pair works; `mtp`: the target drafts with its
    own MTP head (no draft model, so nothing to pair)."""
    t = inspect(target, probe)
    if draft is None:
        return CheckResult(t, None, None, [] if mtp else ["no draft model: speculation can only use prompt lookup"])
    d = inspect(draft, probe)
    bad = first_incompatibility(resolve_vocab(t.info, t.facts), resolve_vocab(d.info, d.facts))
    return CheckResult(t, d, bad, speed_warnings(t.info, d.info))


def require_compatible(target: ModelInfo, draft: ModelInfo) -> None:
    """Refuse, before anything is loaded, a draft that cannot serve the target (headers only)."""
    bad = first_incompatibility(resolve_vocab(target, None), resolve_vocab(draft, None))
    if bad is not None:
        raise PairError(f"the draft {draft.path.name} cannot serve the target {target.path.name} (rule {bad.rule}): "
                        f"{bad.message}", hint="`specdeck check` shows both vocabularies; pick a draft of the same family")


def _params(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _fim(x: Inspected) -> dict[str, int | None]:
    keys = x.info.vocab.fim_ids
    if x.facts is None:
        return dict(keys)
    return {k: (x.facts.fim.get(k) if x.facts.fim.get(k) is not None else keys.get(k)) for k in keys}


def summary(x: Inspected) -> dict[str, Any]:
    """One model's header facts as plain data (the JSON of `check`)."""
    i, v = x.info, x.info.vocab
    kv = sorted({h for h in i.n_head_kv if h})
    return {
        "path": str(i.path),
        "file_size": i.file_size,
        "architecture": i.architecture,
        "name": i.name,
        "parameters": i.n_params,
        "quantization": i.quantization,
        "layers": i.n_layers,
        "attention_layers": i.n_attention_layers,
        "sliding_window_layers": i.n_swa_layers,
        "sliding_window": i.sliding_window if i.n_swa_layers else None,
        "recurrent_layers": i.n_recurrent_layers,
        "mtp_layers": i.n_nextn,
        "heads": i.n_head,
        "kv_heads": kv,
        "head_size_k": i.key_length,
        "head_size_v": i.value_length,
        "context_length": i.context_length,
        "vocab_size": v.size,
        "vocab_type": v.model,
        "tokenizer_pre": v.pre,
        "bos": x.facts.bos if x.facts else v.bos_id,
        "eos": x.facts.eos if x.facts else v.eos_id,
        "eot": x.facts.eot if x.facts else v.eot_id,
        "add_bos": x.facts.add_bos if x.facts else v.add_bos,
        "add_eos": x.facts.add_eos if x.facts else v.add_eos,
        "fim": _fim(x),
        "chat_template": v.chat_template is not None,
        "chat_format": chat_format(v.chat_template),
        "confirmed_by_llama_cpp": x.facts is not None,
    }


def chat_format(template: str | None) -> dict | None:
    """The chat format the server will use with this template (found by rendering through it)."""
    if not template:
        return None
    from app.chat.detect import detect
    from app.chat.template import jinja_render

    spec = detect(template, jinja_render(template))
    return {"name": spec.name, "tools": spec.tools.name if spec.tools else None,
            "reasoning": spec.reasoning is not None, "note": spec.note}


def result_json(r: CheckResult) -> dict[str, Any]:
    return {
        "target": summary(r.target),
        "draft": summary(r.draft) if r.draft else None,
        "compatible": r.compatible,
        "failed_rule": r.incompatibility.rule if r.incompatibility else None,
        "reason": r.incompatibility.message if r.incompatibility else None,
        "warnings": r.warnings,
    }


def _token(x: Inspected, tid: int | None) -> str:
    if tid is None:
        return "-"
    toks = x.info.vocab.tokens
    return f"{tid} {toks[tid]!r}" if 0 <= tid < len(toks) else str(tid)


def _rows(x: Inspected) -> list[tuple[str, str]]:
    s = summary(x)
    fim = s["fim"]
    fim_text = ", ".join(f"{k} {_token(x, t)}" for k, t in fim.items() if t is not None) or "none"
    swa = f"{s['sliding_window_layers']} (window {s['sliding_window']})" if s["sliding_window_layers"] else "0"
    return [
        ("file", f"{Path(s['path']).name} ({s['file_size'] / 2**30:.2f} GiB)"),
        ("architecture", s["architecture"]),
        ("parameters", _params(s["parameters"])),
        ("quantization", s["quantization"]),
        ("layers", f"{s['layers']} ({s['attention_layers']} attention)"),
        ("sliding-window layers", swa),
        ("recurrent layers", str(s["recurrent_layers"])),
        ("MTP head", f"{s['mtp_layers']} layer(s)" if s["mtp_layers"] else "none"),
        ("heads / KV heads / head size", f"{s['heads']} / {','.join(map(str, s['kv_heads'])) or '-'} / {s['head_size_k']}"
         + (f",{s['head_size_v']}" if s["head_size_v"] != s["head_size_k"] else "")),
        ("trained context", f"{s['context_length']:,}"),
        ("vocabulary", f"{s['vocab_size']:,} {s['vocab_type']}" + (f" ({s['tokenizer_pre']})" if s["tokenizer_pre"] else "")),
        ("BOS / EOS / EOT", f"{_token(x, s['bos'])} / {_token(x, s['eos'])} / {_token(x, s['eot'])}"),
        ("adds BOS / EOS", f"{s['add_bos']} / {s['add_eos']}"),
        ("FIM tokens", fim_text),
        ("chat template", "yes" if s["chat_template"] else "no"),
        ("chat format", s["chat_format"]["name"] if s["chat_format"] else "-"),
    ]


def render_models(r: CheckResult) -> Table:
    table = Table(title="GGUF headers", show_lines=False)
    table.add_column("")
    table.add_column("target")
    if r.draft:
        table.add_column("draft")
    rows_t = _rows(r.target)
    rows_d = _rows(r.draft) if r.draft else None
    for n, (label, val) in enumerate(rows_t):
        table.add_row(label, val, *( [rows_d[n][1]] if rows_d else []))
    return table


# -- the command -------------------------------------------------------------------------------

def cmd_check(args: argparse.Namespace) -> int:
    catalog = catalog_from_args(args)
    sel = make_selection(args, catalog)
    fetcher = make_fetcher(offline=True, verify=args.verify)
    target = local_path(fetcher, sel.target)
    draft = local_path(fetcher, sel.draft) if sel.draft else None
    result = check_pair(target, draft, probe=not args.no_probe, mtp=sel.mtp)
    vision = projector_check(local_path(fetcher, sel.mmproj), result.target.info) if sel.mmproj else None
    template = chat_template(template_file(args), sel, result.target.info)
    fallback = template_origin(template, result.target.info.vocab.chat_template) == FALLBACK
    if template is not None:  # the template served in place of the target's own (a given one, or the fallback)
        info = result.target.info
        result = replace(result, target=replace(result.target, info=replace(info, vocab=replace(info.vocab, chat_template=template))))
    if args.json:
        out.print_json(json.dumps({**result_json(result), "mmproj": vision}))
    else:
        out.print(render_models(result))
        for w in result.warnings:
            out.print(f"[yellow]warning:[/] {w}")
        note = (summary(result.target)["chat_format"] or {}).get("note")
        if note:
            out.print(f"[yellow]chat format:[/] {note}", soft_wrap=True)  # one line, however narrow the terminal
        if fallback:
            out.print(f"[yellow]chat template:[/] {FALLBACK_NOTE}", soft_wrap=True)
        if vision is not None:
            out.print(f"[green]vision projector fits[/]: {vision['summary']}" if vision["fits"]
                      else f"[red]vision projector does not fit:[/] {vision['reason']}", soft_wrap=True)
        mtp = result.target.info.n_nextn
        if mtp:
            out.print(f"MTP head: {mtp} layer(s)" + ("" if sel.mtp else " (it drafts with --draft mtp)"))
        if sel.mtp and not mtp:
            out.print(f"[red]--draft mtp:[/] {target.name} has no MTP (nextn) layers to draft with")
        elif sel.mtp:
            out.print("[green]the target drafts for itself[/] with its MTP head")
        elif result.draft is None:
            out.print("[green]target readable[/] (no draft)")
        elif result.compatible:
            out.print("[green]compatible:[/] the draft can serve the target (llama.cpp's rules)")
        else:
            bad = result.incompatibility
            assert bad is not None
            out.print(f"[red]incompatible[/] (rule {bad.rule}): {bad.message}")
    ok = result.compatible and (result.target.info.n_nextn or not sel.mtp) and (vision is None or vision["fits"])
    return 0 if ok else 2


def projector_check(path: Path, target: ModelInfo) -> dict[str, Any]:
    """Whether the projector fits the target: its type and output width against the target's
    embedding width (what libmtmd itself refuses at load)."""
    try:
        p = read_projector(path)
    except GGUFError as e:
        return {"path": str(path), "fits": False, "reason": e.message}
    why = fits(p, target.n_embd)
    return {"path": str(path), "fits": why is None, "reason": why, "projector_type": p.projector_type,
            "n_embd_out": p.n_embd_out, "target_n_embd": target.n_embd, "tokens_per_image": p.tokens_per_image,
            "image_size": p.image_size, "weights_bytes": p.weights_bytes,
            "summary": f"{p.projector_type} projector, rows of width {p.n_embd_out} = the target's; "
                       f"{p.tokens_per_image} tokens an image at {p.image_size}x{p.image_size}"}
