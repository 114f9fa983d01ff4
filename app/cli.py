"""The `specdeck` command: it parses the flags and dispatches to app/commands/. Every failure the user
can cause ends in one clear line and a non-zero exit."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys

from rich.markup import escape

from app import __version__
from app.commands.bench import cmd_bench
from app.commands.check import cmd_check
from app.commands.common import console
from app.commands.dashboard import cmd_dash
from app.commands.doctor import cmd_doctor
from app.commands.equivalence import cmd_verify
from app.commands.kube import cmd_kube
from app.commands.plan import cmd_plan
from app.commands.pull import cmd_models, cmd_pull
from app.commands.revision import cmd_config_history, cmd_rollback, cmd_serve, cmd_up
from app.commands.up import cmd_run
from app.commands.validate import cmd_validate
from app.errors import SpecdeckError
from app.ops.alerts import AlertSettings
from app.plan.planner import PlanRequest
from app.server.settings import ServeSettings
from app.settings import add_flags

# -- wiring ----------------------------------------------------------------------------------

def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="preset, catalogue model, or hf://owner/repo/file.gguf[@rev] (default: the preset for this machine)")
    p.add_argument("--target", help="target model: catalogue name, hf:// URI or GGUF path")
    p.add_argument("--draft", help="draft model: catalogue name, hf:// URI or GGUF path; or mtp: the target's own MTP head (a preset name may go with it)")
    p.add_argument("--mmproj", metavar="FILE", help="the target's vision projector (mmproj GGUF: catalogue name, hf:// URI "
                                                    "or path): images in, on every API (default: the preset's, if it names one)")
    p.add_argument("--no-mmproj", action="store_true", help="leave the preset's vision projector out (text only)")


def _add_plan_overrides(p: argparse.ArgumentParser, draft_max: bool = True) -> None:
    """The planner's inputs a user may fix (PlanRequest's fields; shared by plan, serve, up, run)."""
    add_flags(p, PlanRequest)
    if draft_max:
        add_flags(p, PlanRequest, ("draft_max",))


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    """What serve, up and doctor share: ServeSettings' flags, the key file, the config, the planner's inputs."""
    add_flags(p, ServeSettings)
    p.add_argument("--config", help="TOML config file (default: ~/.config/specdeck/config.toml if present)")
    p.add_argument("--model", action="append", metavar="NAME=PRESET|FILE",
                   help="serve this model under NAME beside the others named so (repeatable; a request's `model` "
                        "picks one; the config's [models.NAME] section holds its draft, context, slots and options)")
    _add_plan_overrides(p, draft_max=False)  # --draft-max is ServeSettings' (config and SPECDECK_DRAFT_MAX apply)
    p.add_argument("--embedding-model", help="serve /v1/embeddings and /api/embed from this model (catalogue name, "
                                             "hf:// URI or GGUF path; default: the preset's, if it names one)")
    add_flags(p, AlertSettings, prefix="alert")


def _add_start_flags(p: argparse.ArgumentParser) -> None:
    """serve and up: a start is a recorded revision; one that fails exits, or with --fallback starts
    the last good one of the same deployment."""
    p.add_argument("--fallback", action=argparse.BooleanOptionalAction, default=False,
                   help="if this start fails, start the last good revision of the same address, port and TLS "
                        "setting instead of exiting (the installed service does; default: exit with the reason)")




class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise SpecdeckError(message, hint=f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specdeck", description="A 27B GGUF target + small draft, speculative decoding, one 24 GB GPU.")
    parser.add_argument("--version", action="version", version=f"specdeck {__version__}")
    parser.add_argument("--models", metavar="FILE", help="model catalogue (default: $SPECDECK_MODELS_FILE or the bundled models.toml)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("models", help="list presets and models, and what is on disk")
    p.add_argument("--prune", action="store_true", help="remove model files no good revision uses (see `specdeck config history`)")
    p.add_argument("--dry-run", action="store_true", help="with --prune: list what would be removed, remove nothing")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("pull", help="download and verify a preset's models (or one model)")
    _add_selection(p)
    p.add_argument("--verify", action="store_true", help="re-hash every file even if it was verified before")
    p.add_argument("--offline", action="store_true", help="use only what is on disk (as HF_HUB_OFFLINE=1)")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("check", help="read both GGUF headers and decide whether the draft can serve the target")
    _add_selection(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--no-probe", action="store_true", help="do not confirm implicit vocabulary settings with llama.cpp")
    p.add_argument("--verify", action="store_true", help="re-hash catalogue files before checking")
    add_flags(p, ServeSettings, ("chat_template_file",))
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plan", help="size context, KV cache types, offload and slots to fit the memory budget")
    _add_selection(p)
    add_flags(p, PlanRequest, ("device", "n_ubatch", "reserve", "margin"))
    _add_plan_overrides(p)
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--offline", action="store_true", help="plan only from files on disk (never read a header from the hub)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("kube", help="Kubernetes manifests for one replica per GPU, from the plan (as serve plans)")
    _add_selection(p)
    _add_serve_flags(p)
    p.add_argument("--image", default=os.environ.get("SPECDECK_IMAGE"),
                   help="the image by digest, REPOSITORY@sha256:DIGEST (default: $SPECDECK_IMAGE)")
    p.add_argument("-o", "--output", metavar="DIR", help="write one file per object into DIR (default: print them)")
    p.add_argument("--name", dest="object_name", default="specdeck", help="the objects' name (default specdeck)")
    p.add_argument("--namespace", default="default", help="their namespace (default default)")
    p.add_argument("--replicas", type=int, default=1, help="replicas, one GPU each (default 1)")
    p.add_argument("--max-replicas", type=int, default=4, help="the autoscaler's ceiling (default 4)")
    p.add_argument("--storage-class", help="the weights volume's storage class (default: the cluster's)")
    p.add_argument("--prometheus", default="http://prometheus-operated.monitoring.svc:9090",
                   help="the Prometheus KEDA asks for the queue gauge")
    p.add_argument("--offline", action="store_true", help="plan only from files on disk (never read a header from the hub)")
    p.add_argument("--litellm", nargs="+", metavar="URL", help="print LiteLLM's proxy config over these specdeck hosts instead")
    p.add_argument("--litellm-model", default="specdeck", help="the model name LiteLLM routes (default specdeck)")
    p.set_defaults(func=cmd_kube)

    p = sub.add_parser("doctor", help="the pre-deployment checklist: build, GPU, memory, disk, models, plan, port, key")
    _add_selection(p)
    _add_serve_flags(p)
    p.add_argument("--offline", action="store_true", help="never read a model header from the hub")
    p.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("verify", help="run prompts with speculation on and off and check every step")
    _add_selection(p)
    p.add_argument("--prompts", metavar="FILE.jsonl", help='lines of {"messages": [...]} or {"prompt": "..."}, optional "kind"')
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    add_flags(p, PlanRequest, ("draft_max", "ctx"), defaults={"draft_max": 8, "ctx": 4096})
    add_flags(p, ServeSettings, ("chat_template_file",))
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("bench", help="tokens/s plain, with the draft, with lookup and adaptive, next to llama-server")
    _add_selection(p)
    p.add_argument("--prompts", metavar="FILE.jsonl", help="your own prompts (as for verify)")
    p.add_argument("--max-tokens", type=int, help="tokens per prompt at most (default 200; the agent workload 512, "
                   "where every answer ends as the model ends it, as an agent receives it)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each workload and mode (default 2)")
    add_flags(p, PlanRequest, ("ctx",), defaults={"ctx": 4096})
    add_flags(p, ServeSettings, ("threads", "chat_template_file"))
    p.add_argument("--no-anchors", action="store_true", help="skip llama-server")
    p.add_argument("--f32-target", action="store_true",
                   help="the target rewritten as F32 (built once into the cache with llama_model_quantize, SHA-256 "
                        "recorded): the same weights, a decode that costs many draft tokens as a 27B's does on a "
                        "card; llama-server's anchors are then draft-simple at n-max 3, 8 and 16 and its n-gram modes")
    p.add_argument("--workload", choices=("builtin", "agent"), default="builtin",
                   help="the built-in prompts, each alone (default), or the agent workload: coding sessions replayed in order")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("serve", help="serve the pair behind an OpenAI-compatible API")
    _add_selection(p)
    _add_serve_flags(p)
    _add_start_flags(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("up", help="pull, verify, check, plan, load, warm up and serve, with a live dashboard")
    _add_selection(p)
    _add_serve_flags(p)
    _add_start_flags(p)
    p.add_argument("--offline", action="store_true", help="use only what is on disk (as HF_HUB_OFFLINE=1)")
    p.add_argument("--verify", action="store_true", help="re-hash every model file even if it was verified before")
    p.add_argument("--interval", type=float, default=1.0, help="dashboard refresh, seconds (default 1)")
    p.add_argument("--log-interval", type=float, default=10.0, help="seconds between status lines when stdout is not a terminal")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("validate", help="the go-live checklist: smoke, speed with speculation on and off, equivalence, "
                                        "TTFT, throughput, long context, soak; save or compare a baseline")
    _add_selection(p)
    _add_serve_flags(p)
    p.add_argument("--url", help="validate a running server instead of starting one (API key from SPECDECK_API_KEY)")
    p.add_argument("--save-baseline", action="store_true", help="record this run as the preset's baseline")
    p.add_argument("--compare", nargs="?", const="", metavar="BASELINE",
                   help="compare with a baseline (default: the preset's saved one); exit 1 on a regression")
    p.add_argument("--tolerance", action="append", metavar="NAME=VALUE",
                   help="change a tolerance: tokens_per_second, acceptance, ttft, memory, errors (e.g. ttft=40%%)")
    p.add_argument("--soak", type=float, default=0.0, metavar="MIN", help="also run MIN minutes of mixed load (default off)")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens per fixed-length generation (default 64)")
    p.add_argument("--repeats", type=int, default=2, help="ABBA rounds per prompt for the speed checks (default 2)")
    p.add_argument("--context-margin", type=int, default=256, help="tokens the long document leaves free (default 256)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("config", help="configuration revisions: `specdeck config history`")
    csub = p.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    h = csub.add_parser("history", help="every recorded revision: status, configuration, last failure")
    h.add_argument("--json", action="store_true", help="print the revisions as one JSON object")
    h.set_defaults(func=cmd_config_history)

    p = sub.add_parser("rollback", help="start a recorded revision (default: the last good one before the current)")
    p.add_argument("revision", nargs="?", type=int, help="the revision number (see `specdeck config history`)")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("dash", help="the live dashboard of a running server (from its /v1/status and /metrics)")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000); API key from SPECDECK_API_KEY")
    p.add_argument("--interval", type=float, default=1.0, help="refresh, seconds (default 1)")
    p.add_argument("--log-interval", type=float, default=10.0, help="seconds between status lines when stdout is not a terminal")
    p.add_argument("--once", action="store_true", help="draw once and exit")
    p.add_argument("--log", action="store_true", help="with --once and no terminal: one log line instead of the panel")
    p.set_defaults(func=cmd_dash)

    p = sub.add_parser("run", help="chat with the pair in the terminal (streamed, with tokens/s and acceptance)")
    _add_selection(p)
    _add_plan_overrides(p)
    p.add_argument("--config", help="TOML config file (default: ~/.config/specdeck/config.toml if present)")
    p.add_argument("--max-tokens", type=int, default=1024, help="most tokens per answer (default 1024)")
    add_flags(p, ServeSettings, ("speculative", "threads", "chat_template_file"))
    p.add_argument("--offline", action="store_true", help="use only what is on disk (as HF_HUB_OFFLINE=1)")
    p.add_argument("--verify", action="store_true", help="re-hash every model file even if it was verified before")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack to stderr (a stuck process)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except SpecdeckError as e:
        console.print(f"[red]error:[/] {escape(e.message)}", soft_wrap=True)  # a message may hold [brackets]
        if e.hint:
            console.print(f"  {escape(e.hint)}", soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - never a traceback for the user unless asked
        if os.environ.get("SPECDECK_DEBUG") == "1":
            raise
        console.print(f"[red]internal error:[/] {type(e).__name__}: {e} (SPECDECK_DEBUG=1 shows the traceback)", soft_wrap=True)
        return 70


if __name__ == "__main__":
    sys.exit(main())
