"""The dashboard, the alert rules and the autoscaler read only metrics the services really export.

Every service that exists in the tree is started as a real process with its metrics
port, exactly as a container runs it, and its /metrics page is scraped; inference is
the test session's shared engine (``inference_service``), not a second one. The
gateway is given one plain and one ``quic://`` inference address, so its QUIC client
(and the QUIC link metrics) are live. A query that names a metric none of them
exports fails the test, naming the panel or alert.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
import pytest_asyncio
import yaml
from llmesh.v1 import cache_pb2, cache_pb2_grpc, common_pb2
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.runtime.cli import catalog
from tests.fixtures.inference import InferenceService
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ROOT
from tests.integration.deploy.metricnames import dashboard_queries, exported, names_in, referenced
from tests.integration.deploy.processes import Service, start

DASHBOARDS = sorted((ROOT / "deploy" / "observability" / "grafana" / "dashboards").glob("*.json"))
ALERTS = ROOT / "deploy" / "observability" / "prometheus" / "alerts.yml"
ADAPTER_RULES = ROOT / "deploy" / "k8s" / "components" / "autoscaling" / "prometheus-adapter-rules.yaml"
HPA = ROOT / "deploy" / "k8s" / "components" / "autoscaling" / "hpa.yaml"
KEDA = ROOT / "deploy" / "k8s" / "components" / "keda" / "scaledobject.yaml"
# Series Prometheus itself makes for every target.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"}


def _service_env(name: str, started: dict[str, Service]) -> dict[str, str]:
    def address(upstream: str) -> str:
        return started[upstream].address if upstream in started else ""

    if name == "gateway":
        # Nothing listens on these inference addresses: the gateway starts anyway (the replicas
        # are just unhealthy), and the quic:// one makes it open a QUIC client endpoint.
        return {
            "LLMESH_GATEWAY_HTTP_HOST": "127.0.0.1",
            "LLMESH_GATEWAY_HTTP_PORT": str(free_port()),
            "LLMESH_GATEWAY_INFERENCE_ADDRESSES": (
                f"127.0.0.1:{free_port()},quic://127.0.0.1:{free_port()}?server_name=inference"
            ),
            "LLMESH_GATEWAY_POLICY_ADDRESS": address("policy"),
            "LLMESH_GATEWAY_CACHE_ADDRESS": address("cache"),
            "LLMESH_GATEWAY_EMBEDDINGS_ADDRESS": address("embeddings"),
            "LLMESH_QUIC_VERIFY": "false",
            "LLMESH_QUIC_CONNECT_TIMEOUT_S": "0.5",
        }
    return {}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def running(redis_url: str) -> AsyncIterator[dict[str, Service]]:
    """Every service of the tree but inference, as processes with their metrics ports."""
    specs = [s for s in catalog.SERVICES if s.name != "inference"]
    started: dict[str, Service] = {}

    async def launch(spec: catalog.ServiceSpec) -> None:
        env = {
            "REDIS_URL": redis_url,
            f"{spec.env_prefix}GRACE_SECONDS": "1",
            **_service_env(spec.name, started),
        }
        started[spec.name] = await start(spec, env, ready_within_s=spec.start_timeout_s)

    try:
        # Upstreams together, then the gateway (it dials them).
        upstreams = [s for s in specs if s.name != "gateway"]
        results = await asyncio.gather(*(launch(s) for s in upstreams), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        for spec in specs:
            if spec.name == "gateway":
                await launch(spec)
        yield started
    finally:
        await asyncio.gather(*(service.stop() for service in started.values()))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def scraped(running: dict[str, Service]) -> dict[str, str]:
    """Exposition text of every running service, by service name."""
    return {name: await service.scrape() for name, service in running.items()}


@pytest.fixture(scope="module")
def inference_page(inference_service: InferenceService) -> str:
    """The inference service's /metrics: the test session's shared engine (tests/fixtures/inference.py)."""
    if inference_service.metrics_url is None:
        # LLMESH_TEST_INFERENCE_ADDRESS: a service started elsewhere, its metrics port unknown.
        # The families then come from the module the service registers them in.
        import services.inference.metrics  # noqa: F401

        return generate_latest(REGISTRY).decode()
    reply = httpx.get(inference_service.metrics_url, timeout=10)
    reply.raise_for_status()
    return reply.text


@pytest.fixture(scope="module")
def exported_names(scraped: dict[str, str], inference_page: str) -> set[str]:
    names = set(PROMETHEUS_SERIES)
    for page in [*scraped.values(), inference_page]:
        names |= exported(page)
    return names


def _report(missing: dict[str, set[str]]) -> str:
    return "\n".join(f"  {where}: {sorted(names)}" for where, names in sorted(missing.items()))


def test_every_service_exports_rpc_metrics(scraped: dict[str, str], inference_page: str) -> None:
    assert scraped, "no service could be started"
    for name, page in [*scraped.items(), ("inference", inference_page)]:
        names = exported(page)
        assert "llmesh_rpc_server_handled_total" in names, name
        assert "llmesh_rpc_server_handling_seconds_bucket" in names, name


def _gauge(page: str, name: str) -> float | None:
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def test_every_service_froze_its_start_up_heap(
    scraped: dict[str, str], inference_page: str, inference_service: InferenceService
) -> None:
    """Each real service process, the engine's included, froze what it had loaded once started
    (services/runtime/entry.py): its full collections walk only what serving allocated."""
    assert scraped, "no service could be started"
    frozen = {name: _gauge(page, "llmesh_gc_frozen_objects") for name, page in scraped.items()}
    if inference_service.metrics_url is not None:  # (not a service started elsewhere)
        frozen["inference"] = _gauge(inference_page, "llmesh_gc_frozen_objects")
    assert all(count is not None and count > 10_000 for count in frozen.values()), frozen


def test_inference_exports_engine_metrics(inference_page: str) -> None:
    names = exported(inference_page)
    assert "llmesh_inference_time_to_first_token_seconds_bucket" in names
    assert "llmesh_inference_num_requests_waiting" in names


def test_gateway_exports_quic_link_metrics(scraped: dict[str, str]) -> None:
    if "gateway" not in scraped:
        pytest.skip("the gateway is not in this tree")
    assert {"llmesh_quic_connected", "llmesh_quic_rtt_seconds"} <= exported(scraped["gateway"])


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_queries_name_exported_metrics(path: Path, exported_names: set[str]) -> None:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    queries = dashboard_queries(dashboard)
    assert queries, f"{path.name} has no queries"
    missing: dict[str, set[str]] = {}
    for where, query in queries:
        names = names_in(query)
        assert names, f"{where}: no metric found in {query!r}"
        unknown = names - exported_names
        if unknown:
            missing[where] = unknown
    assert not missing, f"{path.name} queries metrics nobody exports:\n{_report(missing)}"


def test_alert_rules_name_exported_metrics(exported_names: set[str]) -> None:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    missing: dict[str, set[str]] = {}
    count = 0
    for group in rules["groups"]:
        for rule in group["rules"]:
            count += 1
            unknown = referenced(rule["expr"]) - exported_names
            if unknown:
                missing[rule.get("alert") or rule.get("record")] = unknown
    assert count
    assert not missing, f"alert rules query metrics nobody exports:\n{_report(missing)}"


def _autoscaling_queries() -> dict[str, str]:
    """where -> PromQL (or a metric name) of everything the autoscalers read."""
    queries: dict[str, str] = {}
    config = yaml.safe_load(ADAPTER_RULES.read_text(encoding="utf-8"))
    for rule in yaml.safe_load(config["data"]["config.yaml"])["rules"]:
        queries[f"prometheus-adapter {rule['seriesQuery']}"] = rule["seriesQuery"]
    for hpa in yaml.safe_load_all(HPA.read_text(encoding="utf-8")):
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods":
                name = metric["pods"]["metric"]["name"]
                queries[f"HPA {hpa['metadata']['name']} {name}"] = name
    scaled = yaml.safe_load(KEDA.read_text(encoding="utf-8"))
    for i, trigger in enumerate(scaled["spec"]["triggers"]):
        queries[f"KEDA trigger {i}"] = trigger["metadata"]["query"]
    return queries


def test_autoscaling_metrics_are_exported(exported_names: set[str]) -> None:
    queries = _autoscaling_queries()
    assert len(queries) >= 4
    missing: dict[str, set[str]] = {}
    for where, query in queries.items():
        names = referenced(query)
        assert names, where
        if names - exported_names:
            missing[where] = names - exported_names
    assert not missing, f"autoscaling reads metrics nobody exports:\n{_report(missing)}"


def _sample(page: str, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return 0.0


async def test_response_cache_status_is_counted(running: dict[str, Service]) -> None:
    # The dashboard's hit/miss/stale panel reads this counter: a real lookup must move it.
    if "cache" not in running:
        pytest.skip("the cache service is not in this tree")
    cache = running["cache"]
    series = "llmesh_rpc_server_cache_status_total"
    labels = {"service": "cache", "method": "LookupResponse", "status": "MISS"}
    before = _sample(await cache.scrape(), series, labels)
    key = cache_pb2.ResponseKey(
        model="m", prompt=f"deploy-test {uuid.uuid4()}", sampling=common_pb2.SamplingParams(temperature=0)
    )
    async with grpc.aio.insecure_channel(cache.address) as channel:
        stub = cache_pb2_grpc.ContextCacheServiceStub(channel)
        reply = await stub.LookupResponse(
            cache_pb2.LookupResponseRequest(key=key),
            timeout=10,
            metadata=(("x-llmesh-tenant", "deploy-test"),),
        )
    assert reply.status == common_pb2.CACHE_STATUS_MISS
    assert _sample(await cache.scrape(), series, labels) == before + 1


def test_checker_catches_an_unknown_metric(exported_names: set[str]) -> None:
    # The check above is only as good as the name extraction: a typo must be reported.
    typo = "sum(rate(llmesh_rpc_server_handled_totl[5m]))"
    assert referenced(typo) - exported_names == {"llmesh_rpc_server_handled_totl"}
