# syntax=docker/dockerfile:1
# llmesh inference service, GPU build (vLLM with CUDA), with the default model baked in.
# Build from the repository root:
#   docker build -f deploy/docker/inference-gpu.Dockerfile -t llmesh/inference:dev-gpu .
# Run with the NVIDIA container toolkit (`--gpus all`, or the nvidia.com/gpu resource on
# Kubernetes). CUDA's user-space libraries come with the torch/vLLM wheels; the driver
# comes from the host. Serve a larger model by mounting its checkpoint and setting
# LLMESH_INFERENCE_MODEL (and LLMESH_INFERENCE_TENSOR_PARALLEL_SIZE for several GPUs).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY . .
# The local project with the service's extra; every version is pinned in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install ".[inference-gpu]" \
    && llmesh protos check
RUN LLMESH_DATA_DIR=/opt/llmesh llmesh model prepare

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llmesh-inference-gpu" \
      org.opencontainers.image.source="https://github.com/llmesh/llmesh"
# Triton compiles a small launcher with the system C compiler the first time a kernel runs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libnuma1 libtcmalloc-minimal4 \
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
    TRITON_CACHE_DIR=/tmp/triton \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LLMESH_DATA_DIR=/var/lib/llmesh \
    LLMESH_INFERENCE_MODEL=/opt/llmesh/models/smollm2-135m-instruct \
    LLMESH_INFERENCE_SERVED_MODEL_NAME=smollm2-135m-instruct \
    LLMESH_INFERENCE_HOST=0.0.0.0 \
    LLMESH_INFERENCE_PORT=50051 \
    LLMESH_INFERENCE_METRICS_PORT=51051 \
    LLMESH_INFERENCE_GRACE_SECONDS=60 \
    LLMESH_INFERENCE_ENFORCE_EAGER=false \
    LLMESH_INFERENCE_GPU_MEMORY_UTILIZATION=0.9
RUN mkdir -p /var/lib/llmesh && chown 10001:10001 /var/lib/llmesh
USER 10001:10001
WORKDIR /tmp
EXPOSE 50051 51051
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "/opt/llmesh/healthcheck.py", "inference"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["llmesh", "serve", "inference"]
