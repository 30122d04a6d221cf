#!/usr/bin/env bash
# The TypeScript client's packages (npm ci, pinned by package-lock.json), its generated code
# (buf generate from protos/, offline: the local protoc-gen-es plugin) and a type check.
# Idempotent: npm ci runs again only when package-lock.json changed since the last install.
set -euo pipefail
cd "$(dirname "$0")"

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "setup.sh: $tool is not installed (Node.js >= 18.14.1 with npm)" >&2; exit 1; }
done

stamp=node_modules/.llmesh-installed
if [ ! -f "$stamp" ] || [ package-lock.json -nt "$stamp" ] || [ package.json -nt "$stamp" ]; then
  npm ci --no-audit --no-fund
  touch "$stamp"
fi
npm run --silent generate
npm run --silent typecheck
