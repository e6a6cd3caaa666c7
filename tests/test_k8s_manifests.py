"""The Kubernetes objects of every profile (role model_server_k8s through playbooks/plan.yml,
plan/<profile>/k8s/): each validates offline against the Kubernetes API schemas of the pinned
kubernetes-validate wheel (strict: an unknown or misspelt field fails), for the oldest and the
newest Kubernetes it carries that we claim; the engine's image, command and arguments equal the
ones of the same profile's systemd unit; goldens for b200 and h200-vllm; no secret value in any
file. Real plan runs through ansible-runner on localhost. No Kubernetes API server runs here
(none is in Debian's archive and no image can be pulled): applying is not exercised, only what
playbooks/k8s.yml refuses before it connects (tests/unit/test_model_server_k8s.py and below).

Regenerate the goldens after a reviewed change: UPDATE_GOLDEN=1 pytest tests/test_k8s_manifests.py
"""
import os
import pathlib
import shlex

import pytest
import yaml
from helpers import run_playbook
from kubernetes_validate import utils as kubernetes_validate

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "k8s"
UNIT = pathlib.Path("etc/systemd/system/minimax-m3.service")
# Kubernetes versions the objects must validate for: the oldest still in common support
# (1.30) and the newest schema in the pinned validator.
VERSIONS = ["1.30.0", "1.37.0"]
SEED_DIGEST = "sha256:de63ac56df5d7b064451e21147eaab89634a02332d830ca8c01cb8c033b3a78f"
MANIFEST_PIN = "c" * 64
KEY = "k8s-test-key-3f9a1c77e2-never-in-a-manifest"
RSYNC_PASSWORD = "k8s-test-rsync-password-9d2e-never-written"
# Every profile pinned the way playbooks/k8s.yml requires: one image digest for all (the seed's,
# so b200 is exactly the seed's image; a stand-in digest for the others), a revision, a manifest
# pin, the pre-fill image and the staging daemon's address.
PINS = {"serving_allow_inferred": True, "serving_weights_revision": "b" * 40,
        "serving_image": {"digest": SEED_DIGEST}, "serving_weights_manifest_sha256": MANIFEST_PIN,
        "model_server_k8s_prefill_image": "registry.example.internal/mm3/prefill@sha256:" + "d" * 64,
        "model_server_k8s_rsync_server": "10.20.0.5", "plan_allow_blocked": True,
        "serving_profile": "all"}
SGLANG = ["b200", "b300", "gb300", "gb200", "h200", "mi355x", "mi350x", "mi325x", "mi300x"]
VLLM = ["h200", "cpu-lab"]
KINDS = ["Namespace", "PersistentVolumeClaim", "Job", "Deployment", "Service", "NetworkPolicy",
         "PodDisruptionBudget"]


def plan(tmp_path_factory, name, extravars):
    plan_dir = tmp_path_factory.mktemp("k8s") / name
    runner, out = run_playbook("playbooks/plan.yml", plan_dir.parent / (name + "-runner"),
                               extravars=dict(extravars, plan_dir=str(plan_dir)))
    assert runner.rc == 0, out[-4000:]
    return plan_dir, out


@pytest.fixture(scope="module")
def plan_sglang(tmp_path_factory):
    return plan(tmp_path_factory, "sglang", PINS)


@pytest.fixture(scope="module")
def plan_vllm(tmp_path_factory):
    """vLLM with an API key on a non-loopback bind: the engine reads it from its config file,
    which the pod mounts from a Secret."""
    return plan(tmp_path_factory, "vllm", dict(PINS, serving_engine="vllm", serving_api_key=KEY, weights_sync_password=RSYNC_PASSWORD,
                                               serving_bind_address="0.0.0.0"))


def objects(plan_dir, profile):
    """({kind: object}, [kinds in file order], the file) of plan/<profile>/k8s/minimax-m3.yaml."""
    k8s = plan_dir / profile / "k8s"
    path = k8s / "minimax-m3.yaml"
    assert path.exists(), "no objects rendered for %s: %s" % (
        profile, (k8s / "BLOCKED").read_text() if (k8s / "BLOCKED").exists() else "no k8s directory")
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return {d["kind"]: d for d in docs}, [d["kind"] for d in docs], path


def rendered(request, engine):
    return request.getfixturevalue("plan_sglang" if engine == "sglang" else "plan_vllm")[0]


CASES = [("sglang", p) for p in SGLANG] + [("vllm", p) for p in VLLM]


@pytest.mark.parametrize("engine,profile", CASES)
def test_every_object_validates_against_the_kubernetes_schema(request, engine, profile):
    docs, kinds, _ = objects(rendered(request, engine), profile)
    assert kinds == KINDS
    for version in VERSIONS:
        for kind, doc in docs.items():
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_fails_a_misspelt_field(plan_sglang):
    """The check above can fail: strict validation refuses a field Kubernetes does not have."""
    deployment = objects(plan_sglang[0], "b200")[0]["Deployment"]
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
def test_engine_arguments_equal_the_systemd_units(request, engine, profile):
    plan_dir = rendered(request, engine)
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


@pytest.mark.parametrize("profile,gpus,resource", [
    ("b200", 8, "nvidia.com/gpu"), ("gb200", 4, "nvidia.com/gpu"), ("mi355x", 8, "amd.com/gpu")])
def test_gpu_resource_and_the_tainted_pool(plan_sglang, profile, gpus, resource):
    pod = objects(plan_sglang[0], profile)[0]["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"limits": {resource: gpus}}
    assert pod["tolerations"] == [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}
    assert pod["automountServiceAccountToken"] is False


def test_pods_serve_only_a_verified_volume_and_only_the_gateway_reaches_them(plan_sglang):
    docs, _, _ = objects(plan_sglang[0], "b200")
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    first = pod["initContainers"][0]
    assert first["name"] == "weights-verified"
    assert {"name": "MM3_MANIFEST_SHA256", "value": MANIFEST_PIN} in first["env"]
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


def test_a_keyed_engine_reads_its_key_from_a_secret_and_no_secret_is_written(plan_vllm):
    docs, _, _ = objects(plan_vllm[0], "h200")
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert engine["args"][-2:] == ["--config", "/etc/model-server/engine.yaml"]
    config = next(v for v in pod["volumes"] if v["name"] == "engine-config")
    assert config["secret"]["secretName"] == "minimax-m3-engine-config"
    for path in (plan_vllm[0]).rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert KEY not in text and RSYNC_PASSWORD not in text, path
    assert not [d for d in docs.values() if d["kind"] == "Secret"]


def test_an_unpinned_image_gets_no_objects_only_the_reason(tmp_path_factory):
    """The matrix's tag families (h200 without serving_image) render a unit in a lab plan but no
    Kubernetes objects: a cluster pulls by digest or not at all."""
    plan_dir, _ = plan(tmp_path_factory, "unpinned", dict(
        PINS, serving_profile="h200", serving_image={}, serving_allow_unpinned_image=True))
    assert (plan_dir / "h200" / UNIT).exists()
    assert not (plan_dir / "h200" / "k8s" / "minimax-m3.yaml").exists()
    assert "is not pinned by digest" in (plan_dir / "h200" / "k8s" / "BLOCKED").read_text()


@pytest.mark.parametrize("engine,profile,golden", [("sglang", "b200", "b200"), ("vllm", "h200", "h200-vllm")])
def test_objects_match_golden(request, engine, profile, golden):
    _, _, path = objects(rendered(request, engine), profile)
    expected = GOLDEN / (golden + ".yaml")
    if os.environ.get("UPDATE_GOLDEN") == "1":
        expected.write_text(path.read_text())
    assert path.read_text() == expected.read_text()


# playbooks/k8s.yml refuses before it connects to a cluster (what this machine can show: no
# API server can run here).
APPLY = dict(PINS, serving_profile="b200", k8s_hosts="all", weights_sync_password=RSYNC_PASSWORD)


@pytest.mark.parametrize("extravars,expected", [
    ({}, "Name the cluster with model_server_k8s_kubeconfig"),
    ({"model_server_k8s_kubeconfig": "/nonexistent/kubeconfig"}, "not found: /nonexistent/kubeconfig"),
    ({"model_server_k8s_replicas": 0}, "model_server_k8s_replicas is 0: set an integer from 1 to 64"),
    ({"serving_weights_manifest_sha256": None}, "is not pinned: set serving_weights_manifest_sha256"),
])
def test_k8s_playbook_refuses_before_anything_is_applied(tmp_path, extravars, expected):
    runner, out = run_playbook("playbooks/k8s.yml", tmp_path, extravars=dict(APPLY, **extravars),
                               inventory="k8s-test-cluster,")
    assert runner.rc != 0
    assert expected in out, out[-3000:]
    assert "Nothing was applied" in out
    assert "Apply the namespace first" not in out  # no task that talks to a cluster ran
    assert RSYNC_PASSWORD not in out
