"""The chat fast path (gateway.api.fastpath): what it hands to the FastAPI route, untouched."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from gateway.api.fastpath import ChatFastPath, _json_content
from gateway.api.guard import PRINCIPAL_STATE, replay
from gateway.auth import Principal
from gateway.config import TenantSettings

VALID = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


class Route:
    """The app behind the fast path: records what reached it, with the body it could read."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        message = await receive()
        self.bodies.append(message["body"])


def _scope(
    headers: list[tuple[bytes, bytes]], principal: bool = True, path: str = "/v1/chat/completions"
) -> dict[str, Any]:
    state = {PRINCIPAL_STATE: Principal("t", TenantSettings(), "k")} if principal else {}
    return {"type": "http", "method": "POST", "path": path, "headers": headers, "state": state}


async def _call(scope: dict[str, Any], body: bytes) -> Route:
    route = Route()

    async def client() -> dict[str, Any]:
        raise AssertionError("the body was replayed: nothing more is read from the client")

    async def send(message: MutableMapping[str, Any]) -> None:
        raise AssertionError(f"the fast path answered itself: {message}")

    await ChatFastPath(route)(scope, replay(body, client), send)
    return route


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"", b"[]", json.dumps({"model": "m", "messages": []}).encode()],
)
async def test_a_body_that_does_not_validate_reaches_the_route_whole(body: bytes) -> None:
    route = await _call(_scope([(b"content-type", b"application/json")]), body)
    assert route.bodies == [body]


@pytest.mark.parametrize("content_type", [b"text/plain", b"application/x-www-form-urlencoded"])
async def test_a_body_that_is_not_json_reaches_the_route(content_type: bytes) -> None:
    route = await _call(_scope([(b"content-type", content_type)]), VALID)
    assert route.bodies == [VALID]


async def test_without_a_content_type_the_route_answers() -> None:
    route = await _call(_scope([]), VALID)
    assert route.bodies == [VALID]


async def test_without_the_guards_principal_the_route_authenticates() -> None:
    route = await _call(_scope([(b"content-type", b"application/json")], principal=False), VALID)
    assert route.bodies == [VALID]


async def test_other_paths_pass_through() -> None:
    route = await _call(_scope([(b"content-type", b"application/json")], path="/v1/completions"), VALID)
    assert route.bodies == [VALID]


@pytest.mark.parametrize(
    ("value", "json_"),
    [
        (None, False),
        (b"application/json", True),
        (b"Application/JSON; charset=utf-8", True),
        (b"application/merge-patch+json", True),
        (b"text/json", False),
        (b"multipart/form-data; boundary=x", False),
    ],
)
def test_json_content_types_are_fastapis(value: bytes | None, json_: bool) -> None:
    assert _json_content(value) is json_
