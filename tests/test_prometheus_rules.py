"""deploy/prometheus/alerts.yml against the real promtool and the server's own metrics and alerts.

promtool is Debian's (the `prometheus` package's binary, fetched without root by
scripts/promtool.sh and cached). The rules must pass `promtool check rules`, their unit tests
(alerts_test.yml) must pass `promtool test rules`, every metric they read must be one the server
exports (so renaming a metric breaks here, not in production), every alert the server raises must
have a rule, and the thresholds must be AlertSettings' defaults.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from app.ops.alerts import DEFAULT_SLOWDOWN_C, NAMES, AlertSettings
from app.server.metrics import Metrics

RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"

# app.ops.alerts.NAMES -> the rule in alerts.yml that states the same alert in PromQL.
RULE_FOR = {
    "acceptance_low": "SpecdeckAcceptanceLow",
    "vram_high": "SpecdeckVramHigh",
    "error_rate_high": "SpecdeckErrorRateHigh",
    "queue_saturated": "SpecdeckQueueSaturated",
    "gpu_temperature_high": "SpecdeckGpuTemperatureHigh",
    "gpu_power_high": "SpecdeckGpuPowerHigh",
    "rss_growth": "SpecdeckRssGrowth",
}
SERVER_ALERT = "SpecdeckServerAlert"  # specdeck_alert{name}: the server's own verdicts


@pytest.fixture(scope="module")
def promtool() -> str:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "promtool.sh")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"no promtool (scripts/promtool.sh): {r.stderr.strip() or r.stdout.strip()}"
    path = r.stdout.strip().splitlines()[-1]
    assert Path(path).is_file(), f"scripts/promtool.sh printed {path!r}, which is no file"
    return path


@pytest.fixture(scope="module")
def rules() -> dict[str, dict]:
    doc = yaml.safe_load(RULES.read_text())
    assert [g["name"] for g in doc["groups"]] == ["specdeck"]
    return {r["alert"]: r for r in doc["groups"][0]["rules"]}


def run_promtool(promtool: str, *args: str) -> str:
    r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 0, f"promtool {' '.join(args)} failed:\n{out}"
    return out


def test_promtool_is_debians_2x(promtool):
    version = run_promtool(promtool, "--version")
    assert re.search(r"version 2\.\d+", version), version


def test_rules_pass_promtool_check(promtool):
    out = run_promtool(promtool, "check", "rules", str(RULES))
    assert "SUCCESS: 8 rules found" in out, out


def test_rules_pass_their_unit_tests(promtool):
    out = run_promtool(promtool, "test", "rules", str(RULE_TESTS))
    assert "SUCCESS" in out, out


def exported_names() -> set[str]:
    """Every series name the server's /metrics can carry, from its registry (labelled metrics too,
    which have no samples until a child is set: their family's name stands for them)."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.add(family.name + "_total" if family.type == "counter" else family.name)
        names.update(s.name for s in family.samples)
    return names


def test_rules_read_only_metrics_the_server_exports(rules):
    exported = exported_names()
    assert "specdeck_requests_total" in exported and "specdeck_gpu_power_watts" in exported  # the collection works
    unknown = {f"{alert}: {name}" for alert, rule in rules.items()
               for name in re.findall(r"specdeck_[a-z_]+", rule["expr"]) if name not in exported}
    assert not unknown, f"alerts.yml reads metrics the server does not export: {sorted(unknown)}"


def test_every_server_alert_has_a_rule(rules):
    assert set(RULE_FOR) == set(NAMES), f"map the server's alerts to rules here: {sorted(set(NAMES) ^ set(RULE_FOR))}"
    missing = sorted(f"{name} -> {RULE_FOR[name]}" for name in NAMES if RULE_FOR[name] not in rules)
    assert not missing, f"alerts.yml has no rule for: {missing}"
    assert set(rules) == set(RULE_FOR.values()) | {SERVER_ALERT}, sorted(rules)


def test_every_rule_is_set_up_for_alertmanager(rules):
    for alert, rule in rules.items():
        assert rule.get("for"), f"{alert} has no for:"
        assert rule.get("labels", {}).get("severity") in ("info", "warning", "critical"), alert
        assert {"summary", "description"} <= set(rule.get("annotations", {})), alert


def test_thresholds_are_the_servers_defaults(rules):
    d = {name: f.default for name, f in AlertSettings.model_fields.items()}  # defaults, not this shell's SPECDECK_ALERT_*
    want = {
        "SpecdeckAcceptanceLow": [d["acceptance_min"], d["acceptance_min_drafted"]],
        "SpecdeckVramHigh": [d["vram_watermark"], 1 + d["vram_plan_margin"]],
        "SpecdeckErrorRateHigh": [d["error_rate"], d["error_min_requests"]],
        "SpecdeckGpuTemperatureHigh": [d["gpu_temperature_margin"], DEFAULT_SLOWDOWN_C],
        "SpecdeckGpuPowerHigh": [d["gpu_power"]],
        "SpecdeckRssGrowth": [d["rss_growth"]],
    }
    for alert, figures in want.items():
        numbers = [float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", rules[alert]["expr"])]
        for figure in figures:
            assert any(math.isclose(figure, n) for n in numbers), f"{alert}: {figure} not in {rules[alert]['expr']!r}"
    assert d["queue_saturation"] == 1.0  # the rule compares the depth with the limit itself
    assert f"offset {d['rss_window'] / 60:.0f}m" in rules["SpecdeckRssGrowth"]["expr"]


def test_unit_tests_cover_every_rule_firing_and_quiet(rules):
    fired: set[str] = set()
    quiet: set[str] = set()
    for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        assert group.get("interval") == "1m"
        for case in group.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert fired == set(rules), f"rules without a firing case: {sorted(set(rules) - fired)}"
    assert quiet == set(rules), f"rules without a quiet case: {sorted(set(rules) - quiet)}"
