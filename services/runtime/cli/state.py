"""The state file `llmesh up` writes so that `llmesh smoke` (and people) can find the services."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.runtime.settings import data_dir


def state_path() -> Path:
    return data_dir() / "run" / "up.json"


def write_state(state: dict[str, Any]) -> None:
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2), encoding="utf-8")
    tmp.replace(path)


def read_state() -> dict[str, Any] | None:
    try:
        data = json.loads(state_path().read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def clear_state() -> None:
    state_path().unlink(missing_ok=True)
