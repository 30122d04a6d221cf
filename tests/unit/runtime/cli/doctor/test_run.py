"""`llmesh doctor` as a whole: which checks run, failures as findings, `up`'s preflight, the CLI."""

from __future__ import annotations

import io
import json

import pytest

from services.runtime.cli import catalog, doctor
from services.runtime.cli.doctor import Status, Target


def _policy_port() -> int:
    policy = catalog.service("policy")
    assert policy is not None
    return policy.port


POLICY_PORT = _policy_port()


def test_only_the_checks_of_the_services_started_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def record(name: str) -> doctor.Check:
        def run(_target: Target) -> doctor.Result:
            ran.append(name)
            return doctor.Result(Status.OK, name)

        return doctor.Check(name, run)

    checks = (
        record("always"),
        doctor.Check("engine", lambda _t: doctor.Result(Status.OK, ""), ("inference",)),
    )
    monkeypatch.setattr(doctor, "CHECKS", checks)
    assert [r.name for r in doctor.run_checks(Target(only=("policy",)))] == ["always"]
    assert [r.name for r in doctor.run_checks(Target())] == ["always", "engine"]
    assert ran == ["always", "always"]


def test_a_check_that_raises_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_target: Target) -> doctor.Result:
        raise ImportError("No module named 'faiss'")

    monkeypatch.setattr(doctor, "CHECKS", (doctor.Check("broken", broken),))
    [result] = doctor.run_checks(Target())
    assert result.status is Status.FAIL and result.name == "broken"
    assert result.detail == "could not check: ImportError: No module named 'faiss'"


def test_preflight_stops_at_the_first_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(_target: Target) -> doctor.Result:
        raise AssertionError("ran after a failure")

    monkeypatch.setattr(
        doctor,
        "CHECKS",
        (
            doctor.Check("first", lambda _t: doctor.Result(Status.WARN, "a warning", "a fix")),
            doctor.Check("second", lambda _t: doctor.Result(Status.FAIL, "broken", "do this")),
            doctor.Check("third", never),
        ),
    )
    out = io.StringIO()
    assert doctor.preflight(Target(), out) is False
    assert out.getvalue() == (
        "llmesh up: warning: first: a warning\n"
        "llmesh up: second check failed: broken\n  fix: do this\n  (llmesh doctor runs every check)\n"
    )


def test_cli_json_reports_a_taken_port(listener: int, capsys: pytest.CaptureFixture[str]) -> None:
    code = doctor.cli(["--only", "policy", "--port-offset", str(listener - POLICY_PORT), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["ok"] is False
    ports = next(c for c in report["checks"] if c["name"] == "ports")
    assert ports["status"] == "fail" and f":{listener}" in ports["detail"]
    assert {c["name"] for c in report["checks"]} == {"python", "packages", "stubs", "redis", "ports"}


def test_cli_refuses_an_unknown_service(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        doctor.cli(["--only", "nonesuch"])
    assert "unknown services: nonesuch" in capsys.readouterr().err
    assert catalog.service("nonesuch") is None
