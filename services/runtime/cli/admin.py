"""``llmesh admin``: API keys, tenants and rulesets through the gateway's admin API.

Talks HTTP to ``/v1/admin/...`` (gateway/README.md lists each call) with the gateway's admin
token, taken from ``--token``, else ``LLMESH_GATEWAY_ADMIN_TOKEN``, else the file ``llmesh up``
writes (``<data_dir>/run/admin-token``). The gateway is ``--url``, else ``LLMESH_GATEWAY_URL``,
else ``http://127.0.0.1:8000`` (where ``llmesh up`` serves it)::

    llmesh admin tenants set team-a --models m1,m2 --rpm 60 --tpm 100000 --budget-day 2000000
    llmesh admin keys create --tenant team-a --name ci --expires-in 30d
    llmesh admin keys list [--tenant team-a]
    llmesh admin keys rotate key_0123456789abcdef
    llmesh admin keys revoke key_0123456789abcdef
    llmesh admin tenants list
    llmesh admin rules reload [--file rules.yaml]

A new or rotated key is printed once: it is stored nowhere in clear. ``--json`` prints the API's
answers as they are. Only the standard library is used (the CLI ships without HTTP clients).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from services.runtime.settings import data_dir

DEFAULT_URL = "http://127.0.0.1:8000"
TOKEN_ENV = "LLMESH_GATEWAY_ADMIN_TOKEN"
URL_ENV = "LLMESH_GATEWAY_URL"
TIMEOUT_S = 30.0
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

# `tenants set` options -> the tenant settings they change (gateway/config.py TenantSettings).
_TENANT_OPTIONS: dict[str, str] = {
    "models": "models",
    "rpm": "requests_per_minute",
    "tpm": "tokens_per_minute",
    "budget_day": "token_budget_per_day",
    "budget_month": "token_budget_per_month",
    "max_inflight": "max_inflight",
    "rag_collections": "rag_collections",
    "rag_top_k": "rag_top_k",
    "policy_fail_open": "policy_fail_open",
}


class AdminError(Exception):
    """A call that failed: the message is what the user reads."""


def admin_token_path() -> Path:
    """Where ``llmesh up`` writes the admin token (services/runtime/cli/up.py)."""
    return data_dir() / "run" / "admin-token"


def parse_duration(text: str) -> int:
    """Seconds of ``90``, ``90s``, ``15m``, ``12h``, ``30d`` or ``2w``."""
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 3600, 15m, 12h, 30d, 2w)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _token(given: str | None) -> str:
    if given:
        return given
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = admin_token_path()
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        raise AdminError(
            f"no admin token: pass --token, set {TOKEN_ENV}, or run `llmesh up` (it writes {path})"
        ) from None


class Client:
    """The admin API over urllib."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self._token = token

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise AdminError(f"{method} {path}: HTTP {exc.code}: {_error_message(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(
                f"cannot reach the gateway at {self.url} ({reason}): is it running? (--url or {URL_ENV})"
            ) from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(exc.read() or b"{}")
    except ValueError:
        return str(exc.reason)
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(exc.reason)


# -- output -----------------------------------------------------------------------------------------


def _key_line(key: dict[str, Any]) -> str:
    expires = key.get("expires_at") or "-"
    return (
        f"{key['id']:<22} {key['tenant']:<20} {key['status']:<8} {key['redacted_value']:<20} "
        f"expires={expires} name={key.get('name') or '-'}"
    )


def _print_key(key: dict[str, Any]) -> None:
    print(_key_line(key))
    if "key" in key:
        print(f"key: {key['key']}")
        print("shown once: store it now, the gateway keeps only its hash")


def _print_tenant(tenant: dict[str, Any]) -> None:
    settings = tenant.get("settings", {})
    shown = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(settings.items()))
    print(f"{tenant['name']:<24} {tenant['source']:<13} {shown}")


# -- commands ---------------------------------------------------------------------------------------


def _tenant_changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for option, setting in _TENANT_OPTIONS.items():
        value = getattr(args, option)
        if value is not None:
            changes[setting] = value
    for pair in args.set or ():
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise AdminError(f"--set takes NAME=JSON, got {pair!r}")
        try:
            changes[name.strip()] = json.loads(raw)
        except ValueError:
            changes[name.strip()] = raw  # a bare word is a string
    return changes


def _run(args: argparse.Namespace, client: Client) -> Any:
    area, action = args.area, args.action
    if area == "keys":
        if action == "create":
            body: dict[str, Any] = {"tenant": args.tenant, "name": args.name}
            if args.expires_in is not None:
                body["expires_in"] = args.expires_in
            return client.call("POST", "/v1/admin/keys", body)[1]
        if action == "list":
            query = f"?{urllib.parse.urlencode({'tenant': args.tenant})}" if args.tenant else ""
            return client.call("GET", f"/v1/admin/keys{query}")[1]
        key_id = urllib.parse.quote(args.id, safe="")
        if action == "get":
            return client.call("GET", f"/v1/admin/keys/{key_id}")[1]
        if action == "rotate":
            return client.call("POST", f"/v1/admin/keys/{key_id}/rotate")[1]
        return client.call("DELETE", f"/v1/admin/keys/{key_id}")[1]
    if area == "tenants":
        if action == "list":
            return client.call("GET", "/v1/admin/tenants")[1]
        name = urllib.parse.quote(args.name, safe="")
        if action == "get":
            return client.call("GET", f"/v1/admin/tenants/{name}")[1]
        changes = _tenant_changes(args)
        if args.replace:
            return client.call("PUT", f"/v1/admin/tenants/{name}", changes)[1]
        try:
            return client.call("PATCH", f"/v1/admin/tenants/{name}", changes)[1]
        except AdminError as exc:
            if "HTTP 404" not in str(exc):
                raise
            return client.call("PUT", f"/v1/admin/tenants/{name}", changes)[1]
    try:
        yaml = args.file.read_text(encoding="utf-8") if args.file else ""
    except OSError as exc:
        raise AdminError(f"cannot read the ruleset file: {exc}") from None
    return client.call("POST", "/v1/admin/rulesets/reload", {"yaml": yaml})[1]


def _show(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if isinstance(result, dict) and result.get("object") == "list":
        for item in result.get("data", []):
            (_print_key if item.get("object") == "api_key" else _print_tenant)(item)
        if not result.get("data"):
            print("(none)")
    elif isinstance(result, dict) and result.get("object") == "api_key":
        _print_key(result)
    elif isinstance(result, dict) and result.get("object") == "tenant":
        _print_tenant(result)
    elif isinstance(result, dict) and result.get("object") == "ruleset":
        print(
            f"ruleset {result['version']} active: {result['rule_count']} rules; "
            f"policy version {result['policy_version']}"
        )
    else:
        print(json.dumps(result, indent=2))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmesh admin", description="Manage API keys, tenants and rulesets through the gateway."
    )
    parser.add_argument(
        "--url", default=os.environ.get(URL_ENV) or DEFAULT_URL, help="the gateway's HTTP API"
    )
    parser.add_argument(
        "--token", help=f"admin token (default: ${TOKEN_ENV}, else the file llmesh up writes)"
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON answers")
    areas = parser.add_subparsers(dest="area", required=True, metavar="AREA")

    keys = areas.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="create a key (printed once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    create.add_argument("--expires-in", type=parse_duration, help="e.g. 3600, 12h, 30d, 2w (default: never)")
    listing = keys.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("--tenant")
    for action, help_text in (
        ("get", "show one key"),
        ("rotate", "a new key for the same id; the old one stops working (printed once)"),
        ("revoke", "revoke a key: refused on every gateway at once"),
    ):
        keys.add_parser(action, help=help_text).add_argument("id")

    tenants = areas.add_parser("tenants", help="tenants").add_subparsers(dest="action", required=True)
    tenants.add_parser("list", help="every tenant (stored and configured)")
    tenants.add_parser("get", help="one tenant").add_argument("name")
    put = tenants.add_parser("set", help="create a tenant or change the settings given")
    put.add_argument("name")
    put.add_argument("--models", type=_csv, help="comma-separated; empty: every model")
    put.add_argument("--rpm", type=int, help="requests per minute (0: unlimited)")
    put.add_argument("--tpm", type=int, help="tokens per minute (0: unlimited)")
    put.add_argument("--budget-day", type=int, help="tokens per UTC day (0: no budget)")
    put.add_argument("--budget-month", type=int, help="tokens per calendar month (0: no budget)")
    put.add_argument("--max-inflight", type=int, help="requests in flight at once (0: the gateway's share)")
    put.add_argument("--rag-collections", type=_csv, help="comma-separated RAG collections")
    put.add_argument("--rag-top-k", type=int)
    put.add_argument("--policy-fail-open", action=argparse.BooleanOptionalAction, default=None)
    put.add_argument("--set", action="append", metavar="NAME=JSON", help="any other tenant setting")
    put.add_argument("--replace", action="store_true", help="replace every setting (others: defaults)")

    rules = areas.add_parser("rules", help="policy rulesets").add_subparsers(dest="action", required=True)
    reload = rules.add_parser("reload", help="reload the policy rulesets on the policy service")
    reload.add_argument("--file", type=Path, help="ruleset YAML to load (default: the configured file again)")
    return parser


def cli(argv: list[str]) -> int:
    """Entry point of ``llmesh admin``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        client = Client(args.url, _token(args.token))
        _show(args, _run(args, client))
    except AdminError as exc:
        print(f"llmesh admin: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
