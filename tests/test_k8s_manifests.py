"""The Kubernetes objects of every profile (role model_server_k8s through playbooks/plan.yml,
plan/<profile>/k8s/): each validates offline against the Kubernetes API schemas of the pinned
kubernetes-validate wheel (strict: an unknown or misspelt field fails), for the oldest and the
newest Kubernetes it carries that we claim; the engine's image, command and arguments equal the
ones of the same profile's systemd unit; goldens (tests/golden/k8s/<profile>[-<engine>].yaml, each
compared with its profile's objects: today b200 and h200-vllm); no secret value in any file. The
profiles come from the hardware matrix (roles/serving/vars/main.yml); the objects from the
session's one plan run (fixture `plans` in tests/conftest.py: variants `pinned`, every SGLang
profile, and `keyed-vllm`, every vLLM profile with an API key on a non-loopback bind), through
ansible-runner on localhost. No Kubernetes API server runs here
(none is in Debian's archive and no image can be pulled): applying is not exercised, only what
playbooks/k8s.yml refuses before it connects (tests/unit/test_model_server_k8s.py and below).

Regenerate the goldens after a reviewed change: UPDATE_GOLDEN=1 pytest tests/test_k8s_manifests.py
"""
import os
import pathlib
import shlex

import pytest
import yaml
from helpers import hardware_matrix, matrix_profiles, run_playbook
from kubernetes_validate import utils as kubernetes_validate

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "k8s"
UNIT = pathlib.Path("etc/systemd/system/minimax-m3.service")
# Kubernetes versions the objects must validate for: the oldest still in common support
# (1.30) and the newest schema in the pinned validator.
VERSIONS = ["1.30.0", "1.37.0"]
SGLANG = matrix_profiles("sglang")
VLLM = matrix_profiles("vllm")
KINDS = ["Namespace", "PersistentVolumeClaim", "Job", "Deployment", "Service", "NetworkPolicy",
         "NetworkPolicy", "PodDisruptionBudget"]
# The variant of the session's plan run each engine's objects are read from (tests/conftest.py).
VARIANT = {"sglang": "pinned", "vllm": "keyed-vllm"}
# The device plugins' resource names, per GPU vendor of the matrix (written out here, not read
# from the renderer): NVIDIA's k8s-device-plugin and AMD's ROCm k8s-device-plugin.
GPU_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
GPU_PROFILES = [p for p in SGLANG if hardware_matrix()[p]["gpu"]["vendor"] in GPU_RESOURCE]


def objects(plan_dir, profile):
    """({kind: object}, [kinds in file order], the file) of plan/<profile>/k8s/minimax-m3.yaml; a
    second object of a kind (the pre-fill pod's NetworkPolicy) is keyed "<kind> <name>"."""
    k8s = plan_dir / profile / "k8s"
    path = k8s / "minimax-m3.yaml"
    assert path.exists(), "no objects rendered for %s: %s" % (
        profile, (k8s / "BLOCKED").read_text() if (k8s / "BLOCKED").exists() else "no k8s directory")
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    by_kind = {}
    for d in docs:
        by_kind["%s %s" % (d["kind"], d["metadata"]["name"]) if d["kind"] in by_kind else d["kind"]] = d
    return by_kind, [d["kind"] for d in docs], path


def rendered(plans, engine):
    return plans[VARIANT[engine]].dir


CASES = [("sglang", p) for p in SGLANG] + [("vllm", p) for p in VLLM]


@pytest.mark.parametrize("engine,profile", CASES)
def test_every_object_validates_against_the_kubernetes_schema(plans, engine, profile):
    docs, kinds, _ = objects(rendered(plans, engine), profile)
    assert kinds == KINDS
    for version in VERSIONS:
        for kind, doc in docs.items():
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_fails_a_misspelt_field(plans):
    """The check above can fail: strict validation refuses a field Kubernetes does not have."""
    deployment = objects(plans["pinned"].dir, "b200")[0]["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "IfNotPresent"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicyy"):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def unit_exec_start(unit_text):
    joined = unit_text.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart="):])


def as_docker(container):
    """What `docker run` would be given after its options for this container: the image and
    arguments, or --entrypoint CMD IMAGE ARGS when the container replaces the ENTRYPOINT."""
    command = container.get("command") or []
    assert len(command) <= 1, command
    head = ["--entrypoint", command[0]] if command else []
    return head + [container["image"]] + container["args"]


@pytest.mark.parametrize("engine,profile", CASES)
def test_engine_arguments_equal_the_systemd_units(plans, engine, profile):
    plan_dir = rendered(plans, engine)
    docs, _, _ = objects(plan_dir, profile)
    engine_container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    docker = as_docker(engine_container)
    unit = unit_exec_start((plan_dir / profile / UNIT).read_text())
    start = unit.index(docker[0]) if docker[0] != "--entrypoint" else unit.index("--entrypoint")
    assert unit[start:] == docker
    # the same environment, the weights at the same place, read-only
    unit_env = [unit[i + 1] for i, token in enumerate(unit[:start]) if token == "-e"]
    assert ["%s=%s" % (e["name"], e["value"]) for e in engine_container["env"]] == unit_env
    weights = next(unit[i + 1] for i, t in enumerate(unit) if t == "-v" and ":/models/" in unit[i + 1])
    mount = next(m for m in engine_container["volumeMounts"] if m["name"] == "weights")
    assert weights.split(":")[1:] == [mount["mountPath"], "ro"] and mount["readOnly"] is True
    assert mount["subPath"] == "b" * 40


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_gpu_resource_and_the_tainted_pool(plans, profile):
    gpu = hardware_matrix()[profile]["gpu"]
    gpus, resource = gpu["count"], GPU_RESOURCE[gpu["vendor"]]
    pod = objects(plans["pinned"].dir, profile)[0]["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"limits": {resource: gpus}}
    assert pod["tolerations"] == [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}
    assert pod["automountServiceAccountToken"] is False


def test_pods_serve_only_a_verified_volume_and_only_the_gateway_reaches_them(plans):
    docs, _, _ = objects(plans["pinned"].dir, "b200")
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    first = pod["initContainers"][0]
    assert first["name"] == "weights-verified"
    pin = plans["pinned"].inputs["b200"]["serving_weights_manifest_sha256"]
    assert {"name": "MM3_MANIFEST_SHA256", "value": pin} in first["env"]
    assert [i["name"] for i in pod["initContainers"]] == ["weights-verified", "msa-gate"]
    claim = next(v for v in pod["volumes"] if v["name"] == "weights")["persistentVolumeClaim"]
    assert claim == {"claimName": docs["PersistentVolumeClaim"]["metadata"]["name"], "readOnly": True}
    # 444 GB + 10 % in GiB, rounded up
    assert docs["PersistentVolumeClaim"]["spec"]["resources"]["requests"]["storage"] == "455Gi"
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["ingress"] == [{"from": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "mm3-gateway"}}}], "ports": [{"protocol": "TCP", "port": 30000}]}]
    # the pre-fill pod is never an endpoint of the Service nor counted by the budget
    job_labels = docs["Job"]["spec"]["template"]["metadata"]["labels"]
    for selector in (docs["Service"]["spec"]["selector"], policy["podSelector"]["matchLabels"],
                     docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= docs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
        assert not selector.items() <= job_labels.items()
    probes = pod["containers"][0]
    assert probes["startupProbe"]["failureThreshold"] * probes["startupProbe"]["periodSeconds"] == 3600
    # the engine reaches nothing, the pre-fill pod only the staging host's rsync daemon; both
    # pods run under the runtime's default seccomp filter
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["egress"] == []
    prefill = docs["NetworkPolicy minimax-m3-weights-prefill"]["spec"]
    assert prefill["ingress"] == [] and prefill["podSelector"]["matchLabels"].items() <= job_labels.items()
    assert [rule["ports"][0]["port"] for rule in prefill["egress"]] != []
    for template in (docs["Deployment"]["spec"]["template"], docs["Job"]["spec"]["template"]):
        assert template["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_keyed_engine_reads_its_key_from_a_secret_and_no_secret_is_written(plans):
    docs, _, _ = objects(plans["keyed-vllm"].dir, "h200")
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert engine["args"][-2:] == ["--config", "/etc/model-server/engine.yaml"]
    config = next(v for v in pod["volumes"] if v["name"] == "engine-config")
    assert config["secret"]["secretName"] == "minimax-m3-engine-config"
    inputs = plans["keyed-vllm"].inputs["h200"]
    key, password = inputs["serving_api_key"], inputs["weights_sync_password"]
    for path in plans["keyed-vllm"].dir.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert key not in text and password not in text, path
    assert not [d for d in docs.values() if d["kind"] == "Secret"]


def test_an_unpinned_image_gets_no_objects_only_the_reason(plans):
    """The matrix's tag families (h200 without serving_image) render a unit in a lab plan but no
    Kubernetes objects: a cluster pulls by digest or not at all."""
    plan_dir = plans["unpinned"].dir
    assert (plan_dir / "h200" / UNIT).exists()
    assert not (plan_dir / "h200" / "k8s" / "minimax-m3.yaml").exists()
    assert "is not pinned by digest" in (plan_dir / "h200" / "k8s" / "BLOCKED").read_text()


def golden_case(path):
    """(engine, profile) a k8s golden names: <profile>.yaml SGLang, <profile>-<engine>.yaml."""
    for engine in VARIANT:
        if engine != "sglang" and path.stem.endswith("-" + engine):
            return engine, path.stem[:-len(engine) - 1]
    return "sglang", path.stem


GOLDENS = sorted(GOLDEN.glob("*.yaml"))


def test_every_k8s_golden_is_a_matrix_profile():
    """A golden that no entry renders (a renamed or removed profile, an engine an entry lost) fails."""
    assert GOLDENS
    for path in GOLDENS:
        engine, profile = golden_case(path)
        assert profile in matrix_profiles(engine), "%s: no %s profile %r in the matrix" % (path, engine, profile)


@pytest.mark.parametrize("golden", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_objects_match_golden(plans, golden):
    engine, profile = golden_case(golden)
    _, _, path = objects(rendered(plans, engine), profile)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(path.read_text())
    assert path.read_text() == golden.read_text()


# playbooks/k8s.yml refuses before it connects to a cluster (what this machine can show: no
# API server can run here).
RSYNC_PASSWORD = "k8s-apply-test-rsync-password-51c0-never-printed"


@pytest.mark.parametrize("extravars,expected", [
    ({}, "Name the cluster with model_server_k8s_kubeconfig"),
    ({"model_server_k8s_kubeconfig": "/nonexistent/kubeconfig"}, "not found: /nonexistent/kubeconfig"),
    ({"model_server_k8s_replicas": 0}, "model_server_k8s_replicas is 0: set an integer from 1 to 64"),
    ({"serving_weights_manifest_sha256": None}, "is not pinned: set serving_weights_manifest_sha256"),
])
def test_k8s_playbook_refuses_before_anything_is_applied(plan_pins, tmp_path, extravars, expected):
    apply = plan_pins("b200", serving_profile="b200", k8s_hosts="all", weights_sync_password=RSYNC_PASSWORD)
    runner, out = run_playbook("playbooks/k8s.yml", tmp_path, extravars=dict(apply, **extravars),
                               inventory="k8s-test-cluster,")
    assert runner.rc != 0
    assert expected in out, out[-3000:]
    assert "Nothing was applied" in out
    assert "Apply the namespace first" not in out  # no task that talks to a cluster ran
    assert RSYNC_PASSWORD not in out
