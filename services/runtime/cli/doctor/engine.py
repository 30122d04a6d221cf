"""The inference engine on this machine: its model, allocator, memory and CPU cores."""

from __future__ import annotations

import ctypes.util
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from services.runtime.cli.doctor.install import engine_backend
from services.runtime.cli.doctor.report import GIB, Result, Status, Target

if TYPE_CHECKING:
    from services.inference.config import InferenceSettings

# Need above this share of the available memory leaves too little for everything else.
MEMORY_HEADROOM = 0.8
# A Hugging Face hub id ("org/name"), which vLLM downloads instead of reading a directory.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _inference_settings() -> InferenceSettings:
    # Imported here: pydantic-settings missing is the packages check's finding, not a crash.
    from services.inference.config import InferenceSettings

    return InferenceSettings()


def model_bytes(path: Path) -> int:
    from services.inference.model import weight_files

    return sum(p.stat().st_size for p in weight_files(path))


def check_model(_target: Target) -> Result:
    from services.inference.model import CHECKSUM_FILE, MODEL_NAME, default_model_dir, is_prepared

    settings = _inference_settings()
    if not settings.model:
        folder = default_model_dir()
        if is_prepared(folder):
            return Result(
                Status.OK, f"{MODEL_NAME} prepared at {folder}, {model_bytes(folder) / GIB:.2f} GiB"
            )
        if folder.exists():
            return Result(
                Status.FAIL,
                f"{folder} holds no finished checkpoint (no {CHECKSUM_FILE} or config.json)",
                "llmesh model prepare --force",
            )
        return Result(
            Status.FAIL,
            f"the default model is not prepared: {folder} does not exist",
            "llmesh model prepare (or point LLMESH_INFERENCE_MODEL at a model directory)",
        )
    folder = Path(settings.model).expanduser()
    other = "set LLMESH_INFERENCE_MODEL to a Hugging Face model directory, or unset it for the default model"
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            return Result(
                Status.FAIL, f"{folder} has no config.json: not a Hugging Face model directory", other
            )
        size = model_bytes(folder)
        if size == 0:
            return Result(Status.FAIL, f"{folder} has no weights (*.safetensors, *.bin)", other)
        return Result(Status.OK, f"{folder}, {size / GIB:.2f} GiB of weights")
    if not folder.exists() and _HUB_ID.match(settings.model):
        return Result(
            Status.WARN,
            f"{settings.model!r} is no local directory: vLLM downloads it from the hub at start",
            "an offline machine needs a downloaded model directory in LLMESH_INFERENCE_MODEL",
        )
    return Result(Status.FAIL, f"model directory {folder} does not exist", other)


def check_tcmalloc(_target: Target) -> Result:
    from services.inference.config import TCMALLOC

    if _inference_settings().malloc == "system":
        return Result(Status.OK, "glibc malloc (LLMESH_INFERENCE_MALLOC=system)")
    preloaded = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if "libtcmalloc" in p]
    found = preloaded[0] if preloaded else ctypes.util.find_library(TCMALLOC)
    if found:
        return Result(Status.OK, f"{found} for the engine processes")
    return Result(
        Status.WARN,
        "tcmalloc not found: the engine runs on glibc malloc, whose heap creeps up under steady load",
        "apt-get install libtcmalloc-minimal4, or choose glibc: LLMESH_INFERENCE_MALLOC=system",
    )


def check_memory(target: Target) -> Result:
    settings = _inference_settings()
    if engine_backend() == "gpu":
        return Result(
            Status.OK, f"GPU engine: its KV cache is {settings.gpu_memory_utilization:g} of GPU memory"
        )
    kv = max(settings.kv_cache_space_gib, 0.0) * GIB
    folder = Path(settings.model_path()).expanduser()
    weights = model_bytes(folder) if folder.is_dir() else 0
    need = target.replicas * (kv + weights)
    available, source = available_memory()
    detail = (
        f"{target.replicas} engine(s) x ({kv / GIB:g} GiB KV cache + {weights / GIB:.2f} GiB weights) = "
        f"{need / GIB:.2f} GiB; {available / GIB:.1f} GiB available ({source})"
    )
    fix = (
        f"lower LLMESH_INFERENCE_KV_CACHE_SPACE_GIB (now {settings.kv_cache_space_gib:g}) or "
        "--inference-replicas, or free memory"
    )
    if need > available:
        return Result(Status.FAIL, detail, fix)
    if need > MEMORY_HEADROOM * available:
        return Result(Status.WARN, detail + ": little is left for the other services", fix)
    return Result(Status.OK, detail)


def available_memory() -> tuple[int, str]:
    """Bytes this process could still allocate, and where the bound comes from."""
    available, source = 0, "MemAvailable"
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        available, source = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages"
    limit = _cgroup_int("memory.max", "memory/memory.limit_in_bytes")
    used = _cgroup_int("memory.current", "memory/memory.usage_in_bytes")
    if limit is not None and limit < 1 << 60 and limit - (used or 0) < available:
        return max(limit - (used or 0), 0), "cgroup memory limit"
    return available, source


def check_cpu(target: Target) -> Result:
    settings = _inference_settings()
    if engine_backend() == "gpu":
        return Result(Status.OK, "GPU engine: no CPU thread binding")
    allowed = allowed_cpus()
    bind = settings.threads_bind()
    variable = "LLMESH_INFERENCE_OMP_THREADS_BIND"
    if bind in ("all", "nobind"):
        return Result(Status.OK, f"{variable}={bind}; {len(allowed)} cores allowed ({cpu_list(allowed)})")
    try:
        ranks = [parse_cpu_list(part) for part in bind.split("|")]
    except ValueError:
        return Result(
            Status.FAIL,
            f"{variable}={bind!r} is no core list",
            f"{variable}=auto, or e.g. 0-3 (ranks: 0-3|4-7)",
        )
    if len(ranks) != settings.tensor_parallel_size:
        return Result(
            Status.FAIL,
            f"{len(ranks)} core set(s) in {bind!r} for tensor_parallel_size {settings.tensor_parallel_size}",
            f"one core set per rank, separated by '|', in {variable}",
        )
    bound = set().union(*ranks)
    outside = bound - allowed
    if outside:
        return Result(
            Status.FAIL,
            f"the engine binds cores {cpu_list(outside)}, which this process may not run on "
            f"(allowed: {cpu_list(allowed)})",
            f"{variable}={cpu_list(allowed)} (or a subset of it)",
        )
    detail = f"the engine binds {bind} ({len(bound)} threads); allowed {cpu_list(allowed)}"
    quota = cpu_quota()
    if quota is not None and len(bound) > quota:
        return Result(
            Status.WARN,
            f"{detail}, but the cgroup grants {quota:g} CPUs: the threads get throttled",
            f"bind at most {max(int(quota), 1)} cores in {variable}",
        )
    if target.replicas > 1:
        return Result(
            Status.WARN,
            f"{detail}; all {target.replicas} inference replicas bind the same cores and contend",
            "one engine per core set: fewer --inference-replicas, or start each with its own "
            f"{variable} (llmesh serve inference)",
        )
    return Result(Status.OK, detail)


def allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return set(range(os.cpu_count() or 1))


def cpu_quota() -> float | None:
    """CPUs the cgroup grants (cpu.max / CFS quota); None without a limit."""
    text = _cgroup_text("cpu.max")
    if text is not None:
        quota, _, period = text.partition(" ")
        return None if quota == "max" else int(quota) / int(period or "100000")
    quota_us = _cgroup_int("cpu/cpu.cfs_quota_us", "cpu,cpuacct/cpu.cfs_quota_us")
    period_us = _cgroup_int("cpu/cpu.cfs_period_us", "cpu,cpuacct/cpu.cfs_period_us")
    if quota_us is None or quota_us <= 0 or not period_us:
        return None
    return quota_us / period_us


def parse_cpu_list(text: str) -> set[int]:
    """``0-3,6`` → {0, 1, 2, 3, 6}; ValueError for anything else."""
    cores: set[int] = set()
    for item in text.split(","):
        low, _, high = item.strip().partition("-")
        first, last = int(low), int(high or low)
        if first < 0 or last < first:
            raise ValueError(text)
        cores.update(range(first, last + 1))
    return cores


def cpu_list(cores: set[int]) -> str:
    """{0, 1, 2, 5} → ``0-2,5``."""
    spans: list[str] = []
    for core in sorted(cores):
        if spans and core == int(spans[-1].rsplit("-", 1)[-1]) + 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{core}"
        else:
            spans.append(str(core))
    return ",".join(spans)


def _cgroup_text(*names: str) -> str | None:
    """The first readable file among ``names`` under /sys/fs/cgroup (v2 names first, then v1)."""
    for name in names:
        try:
            return Path("/sys/fs/cgroup", name).read_text(encoding="ascii").strip()
        except OSError:
            continue
    return None


def _cgroup_int(*names: str) -> int | None:
    text = _cgroup_text(*names)
    return int(text) if text is not None and text.lstrip("-").isdigit() else None
