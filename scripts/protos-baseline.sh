#!/usr/bin/env bash
# Records the current contracts as the compatibility baseline that `buf breaking` checks
# every change against (protos/baseline/llmesh-v1.json, a Buf image without source info).
# Run it when a release is cut (or a session's work lands on main), never to silence a
# breaking change: a breaking change goes to llmesh/v2 instead (protos/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LLMESH_VENV:-.venv}
"$VENV/bin/buf" build protos --exclude-source-info -o protos/baseline/llmesh-v1.json
echo "wrote protos/baseline/llmesh-v1.json"
