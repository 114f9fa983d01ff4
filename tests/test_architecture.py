"""The house rules, read from the source with `ast`: no import cycle, no private name imported across
modules, and each folder imports only what its docstring allows."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"

# who may import whom (by top-level folder of app/); a module may always import its own folder
ALLOWED = {
    "build": {"llama"},  # the llama.cpp build: only the backend start-up, to read the build's system info
    "llama": {"errors", "build"},
    "gguf": {"errors", "llama", "units"},
    "models": {"errors", "gguf", "settings", "units"},
    "plan": {"errors", "gguf", "build", "llama", "units", "monitor"},  # monitor: the history ring's size
    "engine": {"errors", "gguf", "plan", "llama", "units"},
    "ops": {"errors", "settings", "units"},
    "chat": {"errors"},
    "drafting": {"errors", "gguf", "plan", "llama", "engine", "units"},  # each drafter kind's parts, declared once
    "server": {"errors", "gguf", "plan", "llama", "engine", "models", "units", "settings", "ops", "chat", "drafting", "ui",
               "monitor"},
    "ui": {"errors", "settings", "monitor"},  # the page: a client of the server's routes (in-process), never of its code
    "monitor": set(),  # the figures' history: plain data in, JSON columns out
    "kube": set(),  # manifests from plans handed over as plain data
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in APP.rglob("*.py") if "__pycache__" not in p.parts}


def _imports(path: Path, mods: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(imported module, name or '', line) for every import of an app module, at any depth."""
    me = _module(path)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.startswith("app")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            if not base.startswith("app"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub, "", node.lineno) if sub in mods else (base, a.name, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {t for t, _, _ in _imports(p, mods) if t in mods and t != m} for m, p in mods.items()}


def test_no_import_cycle():
    graph = _graph()
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_name_imported_across_modules():
    mods = _modules()
    bad = [f"{_module(p)}:{line} imports {name} from {target}"
           for p in mods.values() for target, name, line in _imports(p, mods)
           if name.startswith("_") and not name.startswith("__") and target != _module(p)]
    assert not bad, "\n".join(bad)


def test_each_folder_imports_only_what_it_may():
    mods = _modules()
    bad = []
    for m, p in mods.items():
        parts = m.split(".")
        if len(parts) < 3 or parts[1] not in ALLOWED:
            continue
        folder = parts[1]
        for target, _, line in _imports(p, mods):
            t = target.split(".")
            if len(t) >= 2 and t[1] != folder and t[1] not in ALLOWED[folder] and target != "app":
                bad.append(f"{m}:{line} imports {target} ({folder} may import {sorted(ALLOWED[folder])})")
    assert not bad, "\n".join(bad)


def test_every_folder_says_what_it_owns():
    for init in APP.rglob("__init__.py"):
        if "__pycache__" in init.parts:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 20, f"{init.relative_to(ROOT)} has no docstring saying what it owns"


def test_the_api_reads_the_plan_typed_never_by_key():
    """The plan travels typed to the server: no API module reads it (or any `plan`) as a dict."""
    import re

    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in (APP / "server").glob("*.py")
           for n, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"\bplan(\(\))?\.get\(|\bplan\[", line)]
    assert not bad, bad


def test_the_drafter_seam_knows_no_implementation():
    """drafters/base.py (what every drafter meets) imports nothing of the controller's, and no drafter
    overrides an optional method only to do nothing."""
    base = APP / "engine" / "drafters" / "base.py"
    assert all(m != "app.engine.controller" for m, _, _ in _imports(base, _modules()))
    for p in (APP / "engine" / "drafters").glob("*.py"):
        tree = ast.parse(p.read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name != "DrafterBase"):
            for f in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                body = [s for s in f.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                assert not (len(body) == 1 and isinstance(body[0], ast.Pass)), f"{p.name}: {cls.name}.{f.name} only passes"


def test_every_file_over_400_lines_is_explained():
    """A file is one idea: one over ~400 lines is named, with why, in docs/ARCHITECTURE.md."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = doc[doc.index("## Files over 400 lines"):]
    section = section[: section.index("\n## ", 1)]
    long = [str(p.relative_to(ROOT)) for p in APP.rglob("*.py") if len(p.read_text().splitlines()) > 400]
    assert [f for f in long if f"`{f}`" not in section] == [], long


# flags of serve / up / plan / bench / verify that are not settings, and why
NOT_SETTINGS = {
    "help": "argparse's own",
    "name": "the selection: which preset or model is meant (a reference the catalogue resolves)",
    "target": "the selection", "draft": "the selection", "embedding_model": "the selection",
    "mmproj": "the selection (the target's vision projector)", "no_mmproj": "the selection",
    "model": "the selection: one of several models, by name (its options are the config's [models.NAME] section)",
    "config": "the file settings are read from, not a setting in it",
    "fallback": "how this one start behaves if it fails; not part of the configuration a revision records",
    "json": "the output's format", "offline": "where this run may take models from",
    "verify": "whether this run re-hashes the model files",
    "interval": "the dashboard's redraw", "log_interval": "the dashboard's log lines",
    "prompts": "the workload (bench, verify)", "max_tokens": "the workload's answer length (bench, verify)",
    "repeats": "the benchmark's repetitions", "no_anchors": "whether bench runs llama-server beside",
    "workload": "which workload bench runs",
    "f32_target": "which target bench measures: a stand-in built from the selected one",
}


def test_every_setting_flag_comes_from_a_typed_field():
    """Each flag of these commands is a typed settings field's (ServeSettings, PlanRequest,
    AlertSettings as --alert-*), with that field's description as its help; anything else is named
    above with why."""
    import argparse
    import re

    from app.cli import build_parser
    from app.ops.alerts import AlertSettings
    from app.plan.planner import PlanRequest
    from app.server.settings import ServeSettings

    fields = {**PlanRequest.model_fields, **ServeSettings.model_fields,
              **{"alert_" + k: f for k, f in AlertSettings.model_fields.items()}}
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("serve", "up", "plan", "bench", "verify"):
        for action in commands[name]._actions:
            if action.dest in NOT_SETTINGS:
                continue
            assert action.dest in fields, f"{name} {'/'.join(action.option_strings)}: no settings field, no reason"
            field = fields[action.dest]
            said = (field.json_schema_extra or {}).get("help") or field.description or ""
            said = re.sub(r"\s*\(default: [^)]*\)$", "", said)
            assert action.help.startswith(said), f"{name} {action.option_strings}: help is not the field's"
