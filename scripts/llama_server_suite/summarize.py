#!/usr/bin/env python3
"""Per-file table of a run.sh run: reads RESULTS/junit-*.xml (and collected.txt for 'not run')."""
import collections
import glob
import os
import sys
import xml.etree.ElementTree as ET


def main(results: str) -> None:
    rows = collections.OrderedDict()
    fails = []
    collected = collections.Counter()
    path = os.path.join(results, "collected.txt")
    if os.path.exists(path):
        for line in open(path):
            collected[line.split("::")[0].strip()] += 1
    seen = set()
    for xml in sorted(glob.glob(os.path.join(results, "junit-*.xml"))):
        for case in ET.parse(xml).getroot().iter("testcase"):
            if not case.get("classname"):
                continue  # the test a SIGINT interrupted
            f = case.get("classname").replace(".", "/") + ".py"
            tid = f"{f}::{case.get('name')}"
            if tid in seen:
                continue
            seen.add(tid)
            r = rows.setdefault(f, collections.Counter())
            r["run"] += 1
            kids = {c.tag: c for c in case}
            if "failure" in kids:
                r["failed"] += 1
                fails.append((tid, "FAILED", kids["failure"].get("message", "")))
            elif "error" in kids:
                r["errors"] += 1
                fails.append((tid, "ERROR", kids["error"].get("message", "")))
            elif "skipped" in kids:
                r["skipped"] += 1
            else:
                r["passed"] += 1
    files = list(dict.fromkeys([*collected, *rows]))
    print("| file | collected | run | passed | failed | errors | skipped | not run |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    tot = collections.Counter()
    for f in files:
        r = rows.get(f, collections.Counter())
        n = collected.get(f, r["run"])
        vals = dict(collected=n, run=r["run"], passed=r["passed"], failed=r["failed"], errors=r["errors"],
                    skipped=r["skipped"], notrun=max(0, n - r["run"]))
        tot.update(vals)
        print(f"| {f} | " + " | ".join(str(vals[k]) for k in ("collected", "run", "passed", "failed", "errors", "skipped", "notrun")) + " |")
    print("| total | " + " | ".join(str(tot[k]) for k in ("collected", "run", "passed", "failed", "errors", "skipped", "notrun")) + " |")
    print()
    for tid, kind, msg in fails:
        first = " ".join(msg.split())[:300]
        print(f"- {kind} {tid}: {first}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
