"""The audit log's HMAC key: where it comes from, and the id records carry.

The chain's links are HMAC-SHA256 under a secret kept out of Redis, so whoever can
write Redis (and so rewrite records, heads and checkpoints) cannot recompute a
chain that ``llmesh audit verify`` accepts. The key is, in order: the setting
``LLMESH_POLICY_AUDIT_HMAC_KEY``, the file ``LLMESH_POLICY_AUDIT_HMAC_KEY_FILE``, or,
for a policy service listening on loopback only (``llmesh up``, tests), the file
:func:`default_key_file` in the data directory, generated on first use. A service
that listens beyond loopback without a configured key refuses to start.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from services.runtime.errors import FailedPrecondition
from services.runtime.settings import data_dir, is_loopback

log = logging.getLogger(__name__)

KEY_FILE_NAME = "policy-audit.key"
MIN_KEY_CHARS = 32
ENV_KEY = "LLMESH_POLICY_AUDIT_HMAC_KEY"
ENV_KEY_FILE = "LLMESH_POLICY_AUDIT_HMAC_KEY_FILE"


def default_key_file() -> Path:
    """``<data dir>/policy-audit.key`` (``LLMESH_DATA_DIR``: :func:`services.runtime.settings.data_dir`)."""
    return data_dir() / KEY_FILE_NAME


def key_id(key: bytes) -> str:
    """A short public id of ``key`` (records name the key they were chained with; rotation)."""
    return hmac.new(key, b"llmesh audit key id", hashlib.sha256).hexdigest()[:16]


def mac(key: bytes, record_json: str) -> str:
    """The record's link in the chain: HMAC-SHA256 of its canonical JSON."""
    return hmac.new(key, record_json.encode("utf-8"), hashlib.sha256).hexdigest()


def _checked(key: bytes, where: str) -> bytes:
    if len(key) < MIN_KEY_CHARS:
        raise FailedPrecondition(
            f"the audit HMAC key from {where} is shorter than {MIN_KEY_CHARS} characters"
        )
    return key


def read_key_file(path: Path) -> bytes:
    """The key in ``path`` (its text, surrounding whitespace removed)."""
    try:
        return _checked(path.read_bytes().strip(), str(path))
    except OSError as exc:
        raise FailedPrecondition(f"cannot read the audit HMAC key file {path}: {exc}") from exc


def _load_or_create(path: Path) -> bytes:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(secrets.token_hex(32) + "\n")
            log.warning("generated the audit HMAC key %s (loopback only; keep it to verify the log)", path)
    return read_key_file(path)


def resolve(secret: str, key_file: str, host: str) -> bytes:
    """The policy service's key (module doc); FailedPrecondition when it has none (the service
    then does not start: :func:`policy.app.create`)."""
    if secret:
        return _checked(secret.encode("utf-8"), ENV_KEY)
    if key_file:
        return read_key_file(Path(key_file))
    if is_loopback(host):
        return _load_or_create(default_key_file())
    raise FailedPrecondition(
        f"the policy service listens on {host}, beyond loopback, and has no audit HMAC key: set "
        f"{ENV_KEY} or {ENV_KEY_FILE} (a secret of at least {MIN_KEY_CHARS} characters, e.g. "
        "`openssl rand -hex 32`, kept out of Redis). Without it whoever can write Redis could "
        "rewrite the audit log undetected."
    )


def verifier_keys(files: list[str]) -> list[bytes]:
    """The keys ``llmesh audit verify`` checks with: ``--hmac-key-file`` (repeatable, for logs that
    span a rotation), else the environment, else the default file if it exists."""
    if files:
        return [read_key_file(Path(f)) for f in files]
    secret = os.environ.get(ENV_KEY, "")
    if secret:
        return [_checked(secret.encode("utf-8"), ENV_KEY)]
    env_file = os.environ.get(ENV_KEY_FILE, "")
    if env_file:
        return [read_key_file(Path(env_file))]
    if default_key_file().exists():
        return [read_key_file(default_key_file())]
    raise FailedPrecondition(
        f"no audit HMAC key: pass --hmac-key-file or set {ENV_KEY} / {ENV_KEY_FILE} "
        "(the key the policy service chains records with)"
    )
