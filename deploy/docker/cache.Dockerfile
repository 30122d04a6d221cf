# syntax=docker/dockerfile:1
# llmesh cache service (ContextCacheService: sessions and response cache on Redis).
# Build from the repository root:
#   docker build -f deploy/docker/cache.Dockerfile -t llmesh/cache:dev .
# Runs as uid 10001 and works with a read-only root filesystem (writes go to /tmp).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# CPU wheels of torch: the CUDA build from PyPI adds ~2 GB that a CPU service never loads.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY . .
RUN pip install --extra-index-url "$TORCH_INDEX" . \
    && llmesh protos build \
    && llmesh protos check

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llmesh-cache" \
      org.opencontainers.image.source="https://github.com/llmesh/llmesh"
RUN groupadd --system --gid 10001 llmesh \
    && useradd --system --uid 10001 --gid llmesh --no-create-home --home-dir /tmp llmesh
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/llmesh/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    LLMESH_DATA_DIR=/var/lib/llmesh \
    LLMESH_CACHE_HOST=0.0.0.0 \
    LLMESH_CACHE_PORT=50053 \
    LLMESH_CACHE_METRICS_PORT=51053
RUN mkdir -p /var/lib/llmesh && chown 10001:10001 /var/lib/llmesh
USER 10001:10001
WORKDIR /tmp
EXPOSE 50053 51053
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/llmesh/healthcheck.py", "cache"]
# SIGTERM: health goes NOT_SERVING, new calls are refused, in-flight calls get
# LLMESH_CACHE_GRACE_SECONDS to finish (give the orchestrator a longer stop timeout).
STOPSIGNAL SIGTERM
ENTRYPOINT ["llmesh", "serve", "cache"]
