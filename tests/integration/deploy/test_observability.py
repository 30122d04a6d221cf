"""Prometheus config and alert rules (promtool), the OTel Collector config, Grafana provisioning."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.processes import ROOT
from tests.fixtures.tools import tool

OBSERVABILITY = ROOT / "deploy" / "observability"
RULES_DIR = OBSERVABILITY / "prometheus"
ALERTS = RULES_DIR / "alerts.yml"
COLLECTOR = OBSERVABILITY / "otel-collector.yaml"
README = ROOT / "deploy" / "README.md"


def promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_alert_rules_check() -> None:
    proc = promtool("check", "rules", ALERTS.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alert_rules_unit_tests() -> None:
    proc = promtool("test", "rules", "alerts.test.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_unit_tested_or_listed() -> None:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((RULES_DIR / "alerts.test.yml").read_text(encoding="utf-8"))
    tested = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])}
    assert tested <= alerts
    assert len(tested) >= 6, sorted(tested)


@pytest.mark.parametrize(
    "config", [ROOT / "deploy" / "compose" / "prometheus.yml"], ids=lambda p: p.parent.name
)
def test_prometheus_config_check(config: Path, tmp_path: Path) -> None:
    document = yaml.safe_load(config.read_text(encoding="utf-8"))
    # The container mounts alerts.yml at an absolute path; point the copy at the file here.
    document["rule_files"] = [str(ALERTS)]
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(document), encoding="utf-8")
    proc = promtool("check", "config", str(copy))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook_section() -> None:
    anchors = {
        _slug(line.lstrip("#"))
        for line in README.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            runbook = rule["annotations"]["runbook"]
            path, _, anchor = runbook.partition("#")
            assert path == "deploy/README.md", rule["alert"]
            assert anchor == rule["alert"].lower(), rule["alert"]
            assert anchor in anchors, f"{rule['alert']}: no '{anchor}' section in deploy/README.md"
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}


def test_collector_pipelines_use_defined_components() -> None:
    config: dict[str, Any] = yaml.safe_load(COLLECTOR.read_text(encoding="utf-8"))
    pipelines = config["service"]["pipelines"]
    assert "traces" in pipelines
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in (config.get(kind) or {}), f"{name}: {kind} {component} is not defined"
        assert pipeline["processors"][0] == "memory_limiter", "memory_limiter must run first"
        assert pipeline["processors"][-1] == "batch", "batch must run last"
    for extension in config["service"].get("extensions", []):
        assert extension in config["extensions"]
    # The services export OTLP/gRPC to port 4317 (OTEL_EXPORTER_OTLP_ENDPOINT in compose).
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")


def test_grafana_provisioning_matches_the_dashboard() -> None:
    grafana = OBSERVABILITY / "grafana"
    datasources = yaml.safe_load((grafana / "provisioning" / "datasources" / "prometheus.yml").read_text())
    prometheus = next(d for d in datasources["datasources"] if d["type"] == "prometheus")
    dashboard = json.loads((grafana / "dashboards" / "llmesh.json").read_text(encoding="utf-8"))
    variable = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    assert variable["current"]["value"] == prometheus["uid"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
