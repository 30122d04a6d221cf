#!/usr/bin/env bash
# Smoke checks of the running compose cluster:
#   1. grpcurl against every service (reflection list, describe each service, health SERVING),
#      run inside the gateway container (`llmesh smoke`; the images carry grpcurl). The services
#      speak mutual TLS: grpcurl presents the gateway's certificate from the container's
#      LLMESH_TLS_* settings, and a plaintext or certificate-less call would be refused;
#   2. the OpenAI-compatible HTTP API from the host: readiness, /v1/models, one chat completion.
# Usage: LLMESH_API_KEY=sk-... ./smoke.sh   (from deploy/compose, after `docker-compose up -d`)
# Env: COMPOSE (default docker-compose, Compose v2's standalone binary; "docker compose" for the
#      plugin), LLMESH_HTTP_PORT (8000), LLMESH_API_KEY (required: a key whose hash is in
#      LLMESH_GATEWAY_API_KEYS), LLMESH_SMOKE_MODEL (smollm2-135m-instruct).
set -euo pipefail
cd "$(dirname "$0")"

COMPOSE=${COMPOSE:-docker-compose}
HTTP="http://127.0.0.1:${LLMESH_HTTP_PORT:-8000}"
MODEL=${LLMESH_SMOKE_MODEL:-smollm2-135m-instruct}

running=$($COMPOSE ps --services --filter status=running)
addresses=(gateway:50050 policy:50052 cache:50053 embeddings:50054)
for replica in inference-1 inference-2 gpu-inference; do
  if grep -qx "$replica" <<<"$running"; then addresses+=("$replica:50051"); fi
done
args=()
for address in "${addresses[@]}"; do args+=(--address "$address"); done

echo "==> gRPC: ${addresses[*]}"
$COMPOSE exec -T gateway llmesh smoke "${args[@]}"

if [ -z "${LLMESH_API_KEY:-}" ]; then
  echo "smoke.sh: set LLMESH_API_KEY to a key whose hash is in LLMESH_GATEWAY_API_KEYS (deploy/README.md)" >&2
  exit 2
fi
auth=(-H "Authorization: Bearer $LLMESH_API_KEY")

echo "==> HTTP: $HTTP"
curl -fsS "$HTTP/readyz"
echo
curl -fsS "${auth[@]}" "$HTTP/v1/models"
echo
curl -fsS "${auth[@]}" "$HTTP/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"max_tokens\": 8, \"messages\": [{\"role\": \"user\", \"content\": \"Say hello.\"}]}"
echo
if grep -qx inference-remote <<<"$running"; then
  echo "==> QUIC: the gateway's replicas (inference-remote is reached over quic://inference-remote:4433)"
  curl -fsS "$HTTP/readyz"
  echo
fi
echo "smoke: ok"
