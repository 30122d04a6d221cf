# syntax=docker/dockerfile:1
# llmesh gateway, policy, cache and embeddings: one image per service, each a target of this
# file. Build from the repository root, naming the service as the target:
#   docker build -f deploy/docker/service.Dockerfile --target gateway    -t llmesh/gateway:dev .
#   docker build -f deploy/docker/service.Dockerfile --target policy     -t llmesh/policy:dev .
#   docker build -f deploy/docker/service.Dockerfile --target cache      -t llmesh/cache:dev .
#   docker build -f deploy/docker/service.Dockerfile --target embeddings -t llmesh/embeddings:dev \
#       --build-arg TORCH_INDEX=<your CPU torch index> .
# Each image installs llmesh with its service's extra only (pyproject.toml: core + extra), so
# the gateway, policy and cache carry no torch. They share every layer but the venv and the
# service's settings. Runs as uid 10001 and works with a read-only root filesystem (writes go
# to /tmp). The inference images differ more (system libraries, a model baked in):
# inference-cpu.Dockerfile, inference-gpu.Dockerfile.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY . .

# One venv per service: the local project with that service's extra (pins: pyproject.toml).
# Building the project generates the gRPC stubs (setup.py); `llmesh protos check` proves them current.
FROM build AS gateway-venv
# hadolint ignore=DL3013
RUN pip install ".[gateway]" && llmesh protos check

FROM build AS policy-venv
# hadolint ignore=DL3013
RUN pip install ".[policy]" && llmesh protos check

FROM build AS cache-venv
# hadolint ignore=DL3013
RUN pip install ".[cache]" && llmesh protos check

FROM build AS embeddings-venv
# torch comes with sentence-transformers. Pass your index of CPU torch wheels with
# --build-arg TORCH_INDEX=...: without it pip takes the default index's build, whose CUDA
# libraries add ~2 GB that a CPU service never loads.
ARG TORCH_INDEX
# hadolint ignore=DL3013
RUN pip install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} ".[embeddings]" \
    && llmesh protos check

# What every service image has: the user, the health check, a read-only-friendly environment.
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.source="https://github.com/llmesh/llmesh"
RUN groupadd --system --gid 10001 llmesh \
    && useradd --system --uid 10001 --gid llmesh --no-create-home --home-dir /tmp llmesh \
    && mkdir -p /var/lib/llmesh \
    && chown 10001:10001 /var/lib/llmesh
COPY deploy/docker/healthcheck.py /opt/llmesh/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    LLMESH_DATA_DIR=/var/lib/llmesh
USER 10001:10001
WORKDIR /tmp
# SIGTERM: health goes NOT_SERVING, new calls are refused, in-flight calls get
# LLMESH_<SERVICE>_GRACE_SECONDS to finish (give the orchestrator a longer stop timeout).
STOPSIGNAL SIGTERM

# The OpenAI-compatible HTTP API on 8000 and the gRPC ChatService.
FROM runtime AS gateway
LABEL org.opencontainers.image.title="llmesh-gateway"
COPY --from=gateway-venv /opt/venv /opt/venv
ENV LLMESH_GATEWAY_HOST=0.0.0.0 \
    LLMESH_GATEWAY_PORT=50050 \
    LLMESH_GATEWAY_METRICS_PORT=51050 \
    LLMESH_GATEWAY_HTTP_HOST=0.0.0.0 \
    LLMESH_GATEWAY_HTTP_PORT=8000
EXPOSE 50050 51050 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/llmesh/healthcheck.py", "gateway"]
ENTRYPOINT ["llmesh", "serve", "gateway"]

# PolicyService: input/output rules, PII redaction, audit log.
FROM runtime AS policy
LABEL org.opencontainers.image.title="llmesh-policy"
COPY --from=policy-venv /opt/venv /opt/venv
ENV LLMESH_POLICY_HOST=0.0.0.0 \
    LLMESH_POLICY_PORT=50052 \
    LLMESH_POLICY_METRICS_PORT=51052
EXPOSE 50052 51052
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/llmesh/healthcheck.py", "policy"]
ENTRYPOINT ["llmesh", "serve", "policy"]

# ContextCacheService: sessions and the response cache on Redis.
FROM runtime AS cache
LABEL org.opencontainers.image.title="llmesh-cache"
COPY --from=cache-venv /opt/venv /opt/venv
ENV LLMESH_CACHE_HOST=0.0.0.0 \
    LLMESH_CACHE_PORT=50053 \
    LLMESH_CACHE_METRICS_PORT=51053
EXPOSE 50053 51053
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/llmesh/healthcheck.py", "cache"]
ENTRYPOINT ["llmesh", "serve", "cache"]

# EmbeddingService: all-MiniLM-L6-v2 embeddings (the model is in its Python package),
# ingestion and vector search. Loading the model takes longer than the others' start.
FROM runtime AS embeddings
LABEL org.opencontainers.image.title="llmesh-embeddings"
COPY --from=embeddings-venv /opt/venv /opt/venv
ENV LLMESH_EMBEDDINGS_HOST=0.0.0.0 \
    LLMESH_EMBEDDINGS_PORT=50054 \
    LLMESH_EMBEDDINGS_METRICS_PORT=51054
EXPOSE 50054 51054
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/opt/llmesh/healthcheck.py", "embeddings"]
ENTRYPOINT ["llmesh", "serve", "embeddings"]

# Without --target Docker builds the last stage: this one stops and says what to pass.
FROM ${PYTHON_IMAGE} AS no-target
RUN echo "deploy/docker/service.Dockerfile: build with --target gateway|policy|cache|embeddings" >&2 \
    && exit 1
