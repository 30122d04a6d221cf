#!/usr/bin/env bash
# llmesh tests: the tests' own tools (scripts/test-setup.sh), lint and types, the proto
# contracts (Buf: lint, breaking changes against the recorded baseline), then the whole
# pytest suite against a throwaway Redis.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LLMESH_VENV:-.venv}

bash scripts/test-setup.sh

redis_dir=""
cleanup() {
  # Keeps the tests' exit status: cleaning up never turns a run red.
  local status=$?
  if [ -n "$redis_dir" ]; then
    if [ -f "$redis_dir/redis.pid" ]; then
      pid=$(cat "$redis_dir/redis.pid")
      kill "$pid" 2>/dev/null || true
      # Redis writes its log and removes its pid file while it shuts down: wait until it has
      # exited (at most 10 s) before removing the directory, or rm races it.
      for _ in $(seq 200); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
      done
    fi
    rm -rf "$redis_dir" || echo "could not remove $redis_dir" >&2
  fi
  exit "$status"
}
trap cleanup EXIT

if [ -z "${REDIS_URL:-}" ]; then
  # A Redis of our own on a free loopback port, so tests never touch a real one.
  port=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis_dir=$(mktemp -d)
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$redis_dir" \
    --daemonize yes --pidfile "$redis_dir/redis.pid" --logfile "$redis_dir/redis.log"
  for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.05
  done
  redis-cli -p "$port" ping >/dev/null
  export REDIS_URL="redis://127.0.0.1:$port/0"
  echo "throwaway Redis at $REDIS_URL"
fi

"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
"$VENV/bin/buf" lint protos
"$VENV/bin/buf" breaking protos --against protos/baseline/llmesh-v1.json
# pytest exits 5 when it collects nothing: with `set -e` that fails the run, as it should.
"$VENV/bin/pytest" "$@"
