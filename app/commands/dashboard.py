"""The live dashboard: `render(snapshot) -> renderable` and its helpers, the loop that redraws it
(`watch`), and `specdeck dash`.

A snapshot is the server's /v1/status JSON plus totals read from its /metrics text
(`build_snapshot`). `specdeck up` builds it in-process from the very functions those routes call;
`specdeck dash --url` builds it from the two routes over HTTP. Both then render the same way, so
what you watch locally is what you watch for a server under systemd. Fits 80x24; `log_line` is
the one-line form for a stdout that is not a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from app.commands.common import (
    out,
)
from app.errors import SpecdeckError

GIB = 1024**3
BARS = "▁▂▃▄▅▆▇█"
MAX_SLOT_ROWS = 4



# -- the snapshot -----------------------------------------------------------------------------

def metric_totals(text: str) -> dict:
    """The counters the dashboard shows, summed over labels, from Prometheus text."""
    wanted = {"specdeck_requests": "requests", "specdeck_prompt_tokens": "prompt_tokens",
              "specdeck_completion_tokens": "completion_tokens", "specdeck_draft_tokens": "drafted",
              "specdeck_draft_accepted": "accepted", "specdeck_errors": "errors",
              "specdeck_prompt_cache_tokens": "cached_tokens"}
    totals: dict = {v: 0.0 for v in wanted.values()}
    for fam in text_string_to_metric_families(text):
        if fam.name in wanted:
            totals[wanted[fam.name]] = sum(s.value for s in fam.samples if s.name.endswith("_total"))
        elif fam.name == "specdeck_ttft_seconds":
            vals = {s.name: s.value for s in fam.samples if not s.name.endswith("_bucket")}
            n = vals.get("specdeck_ttft_seconds_count", 0.0)
            totals["ttft_mean_s"] = vals.get("specdeck_ttft_seconds_sum", 0.0) / n if n else None
    return totals


def build_snapshot(status: dict, metrics_text: str | None, source: str, state: str = "serving") -> dict:
    """One dict the dashboard renders: /v1/status as it is, with `totals` from /metrics."""
    snap = dict(status)
    snap["totals"] = metric_totals(metrics_text) if metrics_text else {}
    snap["source"] = source
    snap["state"] = state
    return snap


def loading_snapshot(source: str, state: str) -> dict:
    """What there is to show while a server is not ready (or not reachable)."""
    return {"source": source, "state": state, "totals": {}}


def fetch_snapshot(url: str, api_key: str | None = None, timeout: float = 5.0) -> dict:
    """A snapshot of a running server from its /v1/status and /metrics."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def get(path: str) -> tuple[int, str]:
        req = urllib.request.Request(base + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    try:
        code, body = get("/v1/status")
    except (urllib.error.URLError, OSError) as e:
        return loading_snapshot(base, f"unreachable: {getattr(e, 'reason', e)}")
    if code == 401:
        raise SpecdeckError(f"{base} wants an API key", hint="set SPECDECK_API_KEY to the server's key")
    if code == 503:
        return loading_snapshot(base, "loading models")
    if code != 200:
        return loading_snapshot(base, f"/v1/status answered HTTP {code}")
    try:
        status = json.loads(body)
        mcode, metrics = get("/metrics")
    except (ValueError, urllib.error.URLError, OSError) as e:
        return loading_snapshot(base, f"bad answer: {e}")
    return build_snapshot(status, metrics if mcode == 200 else None, base)


# -- formatting helpers -----------------------------------------------------------------------

def sparkline(values: list[float], width: int) -> str:
    """The last `width` values as block characters scaled to their maximum."""
    vals = values[-width:]
    top = max(vals, default=0.0)
    if top <= 0:
        return BARS[0] * len(vals)
    return "".join(BARS[min(len(BARS) - 1, int(v / top * (len(BARS) - 1) + 0.5))] for v in vals)


def _f(x, fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _gib(x) -> str:
    return "-" if x is None else f"{x / GIB:.1f}"


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _name(path: str | None) -> str:
    return Path(path).name.removesuffix(".gguf") if path else "-"


# -- the screen --------------------------------------------------------------------------------

def _slot_speed(s: dict) -> str:
    """A slot's tokens per target decode over the last 30 s, and its MTP head's acceptance there."""
    out = f" · {s['recent_tokens_per_decode']:.2f}/dec" if s.get("recent_tokens_per_decode") is not None else ""
    if s.get("recent_head_acceptance") is not None:
        out += f" · head {100 * s['recent_head_acceptance']:.0f}%"
    return out


def alert_lines(snap: dict) -> list[str]:
    """One line per raised alert: its name, since when, and what raised it."""
    out = []
    for a in snap.get("alerts") or []:
        if a.get("active"):
            since = time.strftime("%H:%M:%S", time.localtime(a["since"])) if a.get("since") else "?"
            out.append(f"{a['name']} since {since}: {a.get('message', '')}")
    return out


def render(snap: dict) -> RenderableType:
    """The whole dashboard for one snapshot (about 16 lines, 80 columns)."""
    title = f"specdeck {snap.get('model_id', '')} · {snap.get('source', '')}".replace("  ", " ")
    if "plan" not in snap:  # not serving (yet)
        return Panel(Text(snap.get("state", "")), title=title, title_align="left", subtitle="Ctrl-C quits")
    plan = snap.get("plan") or {}
    tot = snap.get("totals") or {}
    hist = (snap.get("history") or {}).get("tokens_per_second") or []
    bucket = (snap.get("history") or {}).get("bucket_s", 5)
    last = snap.get("last_request") or {}
    g = Table.grid(padding=(0, 1))
    g.add_column(style="bold cyan", no_wrap=True, width=9)
    g.add_column(no_wrap=True, overflow="ellipsis", max_width=68)

    for i, line in enumerate(fleet_lines(snap)):
        g.add_row("models" if i == 0 else "", line)
    models = snap.get("models") or {}
    g.add_row("target", _name(models.get("target")))
    draft = models.get("draft")
    g.add_row("draft", "the target's MTP head" if draft == "mtp" else _name(draft) if draft else "[dim]none (prompt lookup only)[/]")
    tgt = plan.get("target") or {}
    where = "VRAM" if plan.get("device") == "cuda" else "RAM"
    g.add_row("plan", f"ctx {plan.get('ctx', 0):,} · KV {tgt.get('type_k', '?')}/{tgt.get('type_v', '?')} · "
                      f"{plan.get('parallel', '?')} slot(s) · draft ≤{plan.get('draft_max', '?')} · "
                      f"{where} {_gib(plan.get('used'))}/{_gib(plan.get('budget'))} GiB")
    g.add_row("", "")

    recent = hist[-12:]
    avg = sum(recent) / len(recent) if recent else None
    g.add_row("decode", f"[bold]{_f(snap.get('recent_tokens_per_second'))}[/] tok/s now · {_f(avg)} avg 1m · "
                        f"last request {_f(last.get('tokens_per_second'))}")
    secs = len(hist) * bucket
    span = f"{secs / 60:.0f}m" if secs >= 60 else f"{secs:.0f}s"
    g.add_row("history", f"[green]{sparkline(hist, 48) or '(no data yet)'}[/] {span} peak {_f(max(hist, default=None))}")
    g.add_row("accept", f"[bold]{_f(snap.get('recent_acceptance'), '{:.2f}')}[/] last {snap.get('window_s', 30):.0f}s · "
                        f"{_f(snap.get('acceptance'), '{:.2f}')} all · tokens/step "
                        f"{_f(snap.get('recent_tokens_per_step'), '{:.2f}')} · drafted/step "
                        f"{_f(snap.get('recent_draft_length'))}")
    g.add_row("latency", f"TTFT {_f(last.get('ttft_s'), '{:.2f}')} s last · {_f(snap.get('ttft_s_mean'), '{:.2f}')} s mean · "
                         f"prompt {_f(last.get('prompt_tokens_per_second'), '{:.0f}')} tok/s last")
    g.add_row("requests", f"{snap.get('busy_slots', 0)} active · {snap.get('queue', 0)} queued · "
                          f"{snap.get('requests_done', 0)} done · [{'red' if tot.get('errors') else 'default'}]"
                          f"{int(tot.get('errors', snap.get('errors', 0)) or 0)} errors[/] · "
                          f"{int(tot.get('completion_tokens', 0)):,} tokens out")
    slots = snap.get("slots") or []
    for s in slots[:MAX_SLOT_ROWS]:
        busy = s.get("state") in ("generating", "prompt")
        k = f" · {s.get('drafter', '')} {s.get('drafted', 0)}/{s['k']}" if busy and "k" in s else ""
        made = f" {s.get('generated', 0)} tok" if busy else ""
        line = f"#{s['id']} [{'yellow' if busy else 'dim'}]{s.get('state', '?')}[/]{made}{k} · cache {s.get('cached_tokens', 0):,}"
        line += _slot_speed(s)
        g.add_row("slot" if s is slots[0] else "", line)
    if len(slots) > MAX_SLOT_ROWS:
        more = slots[MAX_SLOT_ROWS:]
        g.add_row("", f"+{len(more)} more ({sum(1 for s in more if s.get('state') == 'generating')} generating)")
    g.add_row("", "")
    gpus = snap.get("gpu") or []
    for i, gpu in enumerate(gpus[:2]):
        used = gpu["total"] - gpu["free"]
        heat = f" · {gpu['temperature_c']} °C" if gpu.get("temperature_c") is not None else ""
        power = f" · {gpu['power_w']:.0f}/{gpu.get('power_limit_w') or 0:.0f} W" if gpu.get("power_w") is not None else ""
        g.add_row("gpu" if i == 0 else "", f"{gpu['name']} · util {_f(gpu.get('utilization'), '{:.0f}')}% · "
                                           f"VRAM {_gib(used)}/{_gib(gpu['total'])} GiB{heat}{power}")
    if not gpus:
        g.add_row("gpu", "[dim]none (CPU)[/]")
    host = snap.get("host") or {}
    ram_used = host["total"] - host["available"] if "total" in host else None
    g.add_row("host", f"CPU {_f(host.get('cpu_percent'), '{:.0f}')}% · RAM {_gib(ram_used)}/{_gib(host.get('total'))} GiB · "
                      f"server RSS {_gib(host.get('rss'))} GiB")
    for i, line in enumerate(alert_lines(snap)):
        g.add_row("ALERT" if i == 0 else "", f"[bold white on red]{escape(line)}[/]")
    for i, line in enumerate(snap.get("events") or []):
        g.add_row("log" if i == 0 else "", f"[yellow]{escape(line)}[/]")
    sub = f"up {_duration(snap.get('uptime_s'))} · Ctrl-C quits"
    return Panel(g, title=title, title_align="left", subtitle=sub, subtitle_align="right")


def fleet_lines(snap: dict) -> list[str]:
    """Each model's state where a server serves several (the one shown below first, marked)."""
    fleet = snap.get("fleet") or []
    if len(fleet) < 2:
        return []
    out = []
    for m in fleet:
        state = m.get("state", "?")
        color = {"loaded": "green", "loading": "yellow", "unloading": "yellow"}.get(state.split()[0], "dim")
        busy = f" · {m['busy']} busy" if m.get("busy") else ""
        idle = f" · idle {_duration(m['idle_for'])}" if m.get("idle_for") is not None else ""
        ends = f" · unloads in {_duration(m['expires_in'])}" if m.get("expires_in") is not None else ""
        failed = f" · [red]last load failed: {escape(str(m['error']))[:60]}[/]" if m.get("error") else ""
        mark = " ◀" if m.get("name") == snap.get("model") else ""
        out.append(f"[bold]{escape(m.get('name', '?'))}[/]{mark} [{color}]{escape(state)}[/]{busy}{idle}{ends}{failed}")
    return out


def log_line(snap: dict) -> str:
    """The dashboard in one line, for logs (stdout not a terminal)."""
    if "plan" not in snap:
        return f"specdeck {snap.get('source', '')}: {snap.get('state', '')}"
    tot = snap.get("totals") or {}
    parts = [
        f"tok/s {_f(snap.get('recent_tokens_per_second'))}",
        f"acceptance {_f(snap.get('recent_acceptance'), '{:.2f}')}",
        f"tokens/step {_f(snap.get('recent_tokens_per_step'), '{:.2f}')}",
        f"drafted_per_step {_f(snap.get('recent_draft_length'))}",
        f"ttft_s {_f((snap.get('last_request') or {}).get('ttft_s'), '{:.2f}')}",
        f"active {snap.get('busy_slots', 0)}", f"queued {snap.get('queue', 0)}",
        f"done {snap.get('requests_done', 0)}", f"errors {int(tot.get('errors', 0) or 0)}",
        f"tokens_out {int(tot.get('completion_tokens', 0))}",
        f"cpu% {_f((snap.get('host') or {}).get('cpu_percent'), '{:.0f}')}",
    ]
    fleet = snap.get("fleet") or []
    if len(fleet) > 1:
        parts.append("models " + ",".join(f"{m.get('name')}:{str(m.get('state', '?')).split()[0]}" for m in fleet))
    raised = [a["name"] for a in snap.get("alerts") or [] if a.get("active")]
    if raised:
        parts.append("ALERTS " + ",".join(raised))
    return "specdeck: " + " ".join(parts)


def api_key_from_env() -> str | None:
    return os.environ.get("SPECDECK_API_KEY") or None


def watch(snapshot, out: Console, interval: float, log_interval: float, stop: threading.Event | None = None) -> None:
    """Draw `render(snapshot())` until Ctrl-C (or `stop` is set); one log line per `log_interval`
    when not a terminal."""
    stop = stop or threading.Event()
    if out.is_terminal:
        with Live(render(snapshot()), console=out, screen=True, auto_refresh=False) as live:
            while not stop.wait(interval):
                live.update(render(snapshot()), refresh=True)
    else:
        while True:
            print(log_line(snapshot()), flush=True)
            if stop.wait(log_interval):
                return


# -- the command -------------------------------------------------------------------------------

def cmd_dash(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SpecdeckError(f"--url must start with http:// or https:// (got {url})")
    key = api_key_from_env()
    fetch_snapshot(url, key)  # a wrong key is one clear line before the screen opens
    if args.once:

        snap = fetch_snapshot(url, key)
        out.print(render(snap) if out.is_terminal or not args.log else log_line(snap))
        return 0
    try:
        watch(lambda: fetch_snapshot(url, key), out, args.interval, args.log_interval)
    except KeyboardInterrupt:
        pass
    return 0
