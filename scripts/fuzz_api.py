#!/usr/bin/env python3
"""Schema-based fuzz of the HTTP API: schemathesis cases from the served OpenAPI schema, against an
app built on the tiny test models (a real engine, real llama.cpp), on 127.0.0.1. Passes with zero
5xx responses.

    python scripts/fuzz_api.py [--cases 1000] [--json]

Cases are spread over every operation until at least --cases were sent; generation is capped at a
few tokens per case (the fuzz is about the request surface, not long answers). A bounded slice of
this runs in the test suite (tests/test_server.py::test_schema_fuzz_no_server_errors).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.live import LiveServer, free_port
from support.tinymodels import write_tiny_model

from app.server.settings import ServeSettings

CHAT_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"


def fuzz(url: str, cases: int) -> dict:
    import schemathesis

    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    per_op = max(1, -(-cases // len(ops)))
    codes: collections.Counter = collections.Counter()
    by_op: dict[str, collections.Counter] = {}
    failures: list[dict] = []
    rounds = 0
    while sum(codes.values()) < cases and rounds < 20:  # operations with few possible inputs stop early: go round again
        rounds += 1
        _round(url, ops, per_op, codes, by_op, failures)
    return {"cases": sum(codes.values()), "rounds": rounds, "status_codes": dict(sorted(codes.items())),
            "server_errors": len(failures), "operations": {k: dict(v) for k, v in by_op.items()}, "failures": failures[:20]}


def _round(url: str, ops: list, per_op: int, codes: collections.Counter, by_op: dict, failures: list) -> None:
    from hypothesis import HealthCheck, given, settings

    for op in ops:
        seen = by_op.setdefault(f"{op.method.upper()} {op.path}", collections.Counter())

        @settings(max_examples=per_op, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def check(case):
            if isinstance(case.body, dict):  # keep answers short: the surface is what is fuzzed
                for k in ("max_tokens", "max_completion_tokens", "n_predict", "num_predict"):
                    if k in case.body:
                        case.body[k] = 2
                case.body.setdefault("max_tokens", 2)
                if "model" in case.body and sum(codes.values()) % 2 == 0:
                    case.body["model"] = "tiny"  # half the cases get past the model check, deeper into the route
            r = case.call(base_url=url, timeout=60)
            codes[r.status_code] += 1
            seen[r.status_code] += 1  # noqa: B023 - check() runs within this iteration
            if r.status_code >= 500:
                failures.append({"op": f"{case.method} {case.path}", "body": repr(case.body)[:300],
                                 "status": r.status_code, "response": r.text[:300]})

        check()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1000, help="at least this many cases in all (default 1000)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        t = write_tiny_model(Path(d) / "target.gguf", seed=0, chat_template=CHAT_TEMPLATE)
        dr = write_tiny_model(Path(d) / "draft.gguf", seed=1, n_layers=1, chat_template=CHAT_TEMPLATE)
        server = LiveServer(t, dr, ServeSettings(port=free_port(), max_queue=4), parallel=2)
        try:
            t0 = time.time()
            result = fuzz(server.url, args.cases)
            result["seconds"] = round(time.time() - t0, 1)
            import httpx

            result["healthy_after"] = httpx.get(server.url + "/health").json() == {"status": "ok"}
        finally:
            server.close()
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{result['cases']} cases in {result['seconds']} s over {len(result['operations'])} operations; "
              f"status codes {result['status_codes']}; 5xx: {result['server_errors']}; "
              f"healthy after: {result['healthy_after']}")
        for f in result["failures"]:
            print("  5xx:", f)
    return 0 if result["server_errors"] == 0 and result["healthy_after"] and result["cases"] >= args.cases else 1


if __name__ == "__main__":
    sys.exit(main())
