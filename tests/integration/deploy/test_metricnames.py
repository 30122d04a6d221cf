"""The PromQL and exposition parsing the dashboard and alert checks rely on."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest

from tests.integration.deploy.metricnames import exported, grafana_query_names, referenced


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('up{job=~"gateway|inference"} == 0', {"up"}),
        (
            "histogram_quantile(0.95, sum by (le, service) (rate(llmesh_rpc_server_handling_seconds_bucket"
            '{method!~".*Stream.*"}[$__rate_interval])))',
            {"llmesh_rpc_server_handling_seconds_bucket"},
        ),
        (
            'sum by (service) (rate(a_total{code=~"INTERNAL|UNKNOWN"}[5m]))'
            " / sum by (service) (rate(a_total[5m])) > 0.05",
            {"a_total"},
        ),
        ("sum(rate(x_total[1m])) by (replica) / ignoring(le) group_left(model) y", {"x_total", "y"}),
        ("max_over_time(g[10m:1m] offset 1h) and on (peer) h > bool 1e3", {"g", "h"}),
        ('sum(up{job="inference"}) == 0 or absent(up{job="inference"})', {"up"}),
        ('label_replace(k, "dst", "$1", "src", "(.*)") unless l @ end()', {"k", "l"}),
        ("foo:recorded:rate5m * 100", {"foo:recorded:rate5m"}),
    ],
)
def test_referenced_names(expr: str, names: set[str]) -> None:
    assert referenced(expr) == names


def test_grafana_template_queries() -> None:
    assert grafana_query_names("label_values(llmesh_inference_num_requests_running, replica)") == {
        "llmesh_inference_num_requests_running"
    }
    assert grafana_query_names("label_values(replica)") == set()  # the label-only form names no metric
    assert grafana_query_names("query_result(topk(5, sum by (m) (rate(z_total[5m]))))") == {"z_total"}


def test_exported_names_include_unobserved_labelled_metrics() -> None:
    registry = CollectorRegistry()
    Counter("c_total", "h", ["x"], registry=registry)  # no child yet: only # TYPE lines
    Histogram("h_seconds", "h", ["x"], registry=registry)
    Gauge("g", "h", registry=registry)
    Summary("s", "h", registry=registry)
    names = exported(generate_latest(registry).decode())
    expected = {"c_total", "c_created", "h_seconds_bucket", "h_seconds_sum", "h_seconds_count", "g", "s_sum"}
    assert expected <= names
    assert "c" not in names and "h_seconds" not in names
