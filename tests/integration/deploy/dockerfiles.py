"""Dockerfile parsing for the deploy checks (no Docker engine here)."""

from __future__ import annotations

import re
from pathlib import Path


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += line.removesuffix("\\").strip() + " "
        if not line.endswith("\\"):
            keyword, _, args = pending.strip().partition(" ")
            out.append((keyword.upper(), args.strip()))
            pending = ""
    return out


def stages(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions (its FROM first) by stage name (``FROM x AS name``), in order;
    an unnamed stage is named by its index."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, args in instructions(path):
        if keyword == "FROM":
            words = args.split()
            name = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else str(len(out))
            current = out.setdefault(name, [])
        if keyword != "ARG" or current:  # ARGs before the first FROM are no stage's
            current.append((keyword, args))
    return out


def final_stage(path: Path, target: str | None = None) -> list[tuple[str, str]]:
    """What the image built for ``target`` (default: the last stage) is made of: the target's
    instructions after those of the stages it is built FROM in this file, base first."""
    found = stages(path)
    name = target or list(found)[-1]
    chain: list[list[tuple[str, str]]] = []
    while name in found:
        chain.insert(0, found[name])
        name = found[name][0][1].split()[0]  # FROM <base> [AS name]: the base
    assert chain, f"{path.name} has no stage {target!r}"
    return [step for stage in chain for step in stage]


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in stage:
        if keyword == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return env
