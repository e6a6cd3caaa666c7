"""Unit tests of the Kubernetes half of filter_plugins/model_server.py: the central check of
every model_server_k8s_* value and of what the pod is made of (k8s_problems), each refusal
naming its fix, and the refusal of k8s_manifests itself. The spec comes from the real matrix;
the settings from the role's own defaults with the site's values filled in."""
import base64
import pathlib
import sys

import pytest
from ansible.errors import AnsibleFilterError

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "filter_plugins"))

import model_server as ms  # noqa: E402
import serving  # noqa: E402
from helpers import k8s_settings as settings  # noqa: E402
from helpers import API_ANNOTATIONS_MAX, API_CONFIGMAP_MAX, applied_annotations_size  # noqa: E402
from helpers import serving_args  # noqa: E402

SEED_DIGEST = "sha256:de63ac56df5d7b064451e21147eaab89634a02332d830ca8c01cb8c033b3a78f"


def spec(profile="b200", **kw):
    kw.setdefault("weights_revision", "b" * 40)
    kw.setdefault("weights_manifest_sha256", "c" * 64)
    return serving.serving_resolve(*serving_args(profile=profile, **kw))


def test_the_defaults_with_the_sites_two_values_render():
    assert ms.k8s_problems(spec(), settings()) == []
    kinds = [o["kind"] for o in ms.k8s_manifests(spec(), settings())]
    assert kinds == ["Namespace", "PersistentVolumeClaim", "Job", "Deployment", "Service",
                     "NetworkPolicy", "NetworkPolicy", "PodDisruptionBudget"]


def _by_name(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_every_pod_runs_under_the_runtime_default_seccomp_filter():
    """Pod Security 'restricted' requires it; Kubernetes applies none by default (docker does)."""
    objs = ms.k8s_manifests(spec(), settings())
    pods = [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "Job")]
    assert len(pods) == 2
    for pod in pods:
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("server,port,egress", [
    ("192.0.2.10", 873, [{"ports": [{"protocol": "TCP", "port": 873}],
                          "to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}]}]),
    ("2001:db8::5", 8873, [{"ports": [{"protocol": "TCP", "port": 8873}],
                            "to": [{"ipBlock": {"cidr": "2001:db8::5/128"}}]}]),
    ("staging.example.net", 873, [{"ports": [{"protocol": "TCP", "port": 873}]},
                                  {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]),
])
def test_the_engine_reaches_nothing_and_the_prefill_pod_only_the_rsync_daemon(server, port, egress):
    objs = _by_name(ms.k8s_manifests(spec(), settings(rsync_server=server, rsync_port=port)))
    engine = objs[("NetworkPolicy", "minimax-m3-from-gateway")]["spec"]
    assert engine["policyTypes"] == ["Ingress", "Egress"] and engine["egress"] == []
    prefill = objs[("NetworkPolicy", "minimax-m3-weights-prefill")]["spec"]
    assert prefill["policyTypes"] == ["Ingress", "Egress"] and prefill["ingress"] == []
    assert prefill["egress"] == egress
    job = next(o for (kind, _), o in objs.items() if kind == "Job")
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    deploy_labels = objs[("Deployment", "minimax-m3")]["spec"]["template"]["metadata"]["labels"]
    assert prefill["podSelector"]["matchLabels"].items() <= job_labels.items()
    assert not prefill["podSelector"]["matchLabels"].items() <= deploy_labels.items()


@pytest.mark.parametrize("overrides,expected", [
    ({"name": "MiniMax_M3"}, "model_server_k8s_name is 'MiniMax_M3': set a DNS-1123 label"),
    ({"name": "m" * 41}, "longer than 40 characters"),
    ({"namespace": "ns\nx"}, "model_server_k8s_namespace holds a control character"),
    ({"gateway_namespace": ""}, "model_server_k8s_gateway_namespace is empty"),
    ({"replicas": 0}, "model_server_k8s_replicas is 0: set an integer from 1 to 64"),
    ({"replicas": "2"}, "model_server_k8s_replicas is '2'"),
    ({"replicas": True}, "model_server_k8s_replicas is True"),
    ({"startup_timeout_s": 5}, "model_server_k8s_startup_timeout_s is 5"),
    ({"shm_size": "32g"}, "model_server_k8s_shm_size is '32g': set a quantity such as 32Gi"),
    ({"weights_size": "500GB"}, "model_server_k8s_weights_size is '500GB'"),
    ({"weights_access_modes": ["ReadWriteAll"]}, "model_server_k8s_weights_access_modes is ['ReadWriteAll']"),
    ({"weights_access_modes": []}, "model_server_k8s_weights_access_modes is []"),
    ({"weights_storage_class": "Fast SSD"}, "model_server_k8s_weights_storage_class is 'Fast SSD'"),
    ({"node_selector": {"gpu pool": "b200"}}, "model_server_k8s_node_selector key"),
    ({"node_selector": ["b200"]}, "model_server_k8s_node_selector is a list"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "effect": "NoScheduleX"}]}, "tolerations[0].effect is 'NoScheduleX'"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "In"}]}, "tolerations[0].operator is 'In'"),
    ({"tolerations": [{"key": "a", "toleration": "b"}]}, "model_server_k8s_tolerations[0] is"),
    ({"tolerations": "nvidia.com/gpu"}, "model_server_k8s_tolerations is a str"),
    ({"msa_gate_command": ["python3", "-c", "print(1)\x07"]}, "model_server_k8s_msa_gate_command must be"),
    ({"prefill_image": ""}, "model_server_k8s_prefill_image is empty"),
    ({"prefill_image": "debian:12"}, "model_server_k8s_prefill_image is 'debian:12': set an image"),
    ({"rsync_server": "staging; rm -rf /"}, "model_server_k8s_rsync_server is 'staging; rm -rf /'"),
    ({"rsync_port": 70000}, "model_server_k8s_rsync_port is 70000"),
    ({"rsync_user": "Weights User"}, "model_server_k8s_rsync_user is 'Weights User'"),
    ({"rsync_secret": "Secret!"}, "model_server_k8s_rsync_secret is 'Secret!'"),
    ({"prefill_bwlimit": -1}, "model_server_k8s_prefill_bwlimit is -1"),
    ({"config_container_path": "engine.yaml"}, "config_container_path 'engine.yaml' is not an absolute file path"),
])
def test_each_bad_setting_is_refused_with_its_fix(overrides, expected):
    problems = ms.k8s_problems(spec(), settings(**overrides))
    assert any(expected in p for p in problems), problems
    with pytest.raises(AnsibleFilterError, match="refusing to render the Kubernetes objects"):
        ms.k8s_manifests(spec(), settings(**overrides))


def test_an_image_without_a_digest_is_refused():
    unpinned = spec("h200", engine="vllm", allow_unpinned_image=True)
    assert unpinned["image"]["digest"] is None
    problems = ms.k8s_problems(unpinned, settings())
    assert any("vllm/vllm-openai:minimax-m3 is not pinned by digest" in p and "serving_image" in p
               for p in problems), problems
    assert ms.k8s_problems(spec("h200", engine="vllm", image={"digest": SEED_DIGEST}), settings()) == []


def test_unpinned_weights_are_refused():
    problems = ms.k8s_problems(spec(weights_manifest_sha256=None), settings())
    assert any("is not pinned: set serving_weights_manifest_sha256" in p for p in problems), problems
    problems = ms.k8s_problems(spec(weights_revision="main"), settings())
    assert any("is not a full commit sha" in p for p in problems), problems


def _configmap(data, binary=None, annotations=None):
    meta = {"name": "big", "namespace": "minimax-m3"}
    if annotations:
        meta["annotations"] = annotations
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
    if binary:
        obj["binaryData"] = binary
    return obj


def test_an_object_the_api_server_refuses_for_its_size_is_refused_from_one_byte_over_its_limit():
    """Annotations as kubernetes.core.k8s apply: true leaves them (its own annotate(): the object
    recorded in one) fit at 256 KiB and are refused one byte over, the object's own annotations
    counted with it; a ConfigMap's data, summed over its items and binaryData's decoded bytes, fits
    at 1 MiB and is refused one byte over. Each refusal names the object, its size and the limit."""
    room = API_ANNOTATIONS_MAX - applied_annotations_size(_configmap({"a": ""}))
    fits = _configmap({"a": "x" * room})
    assert applied_annotations_size(fits) == API_ANNOTATIONS_MAX and ms.k8s_size_problems([fits]) == []
    over = _configmap({"a": "x" * (room + 1)})
    problems = ms.k8s_size_problems([over])
    assert len(problems) == 1 and problems[0].startswith(
        "ConfigMap big would carry 262,145 bytes of annotations once applied (kubectl.kubernetes.io/"
        "last-applied-configuration, the object itself, which kubernetes.core.k8s apply: true records), "
        "more than the 262,144 an API server admits on one object; its largest items: a "), problems
    own = {"example.com/n": "1234567"}   # 20 bytes an API server counts beside the record
    room = API_ANNOTATIONS_MAX - applied_annotations_size(_configmap({"a": ""}, annotations=own))
    assert ms.k8s_size_problems([_configmap({"a": "x" * room}, annotations=own)]) == []
    assert ms.k8s_size_problems([_configmap({"a": "x" * (room + 10)}, annotations=own)])   # the record alone: 10 under
    half = API_CONFIGMAP_MAX // 2
    at_limit = _configmap({"a": "x" * half, "b": "y" * (half - 7)}, binary={"c": base64.b64encode(b"z" * 7).decode()})
    assert not any("bytes of data" in p for p in ms.k8s_size_problems([at_limit]))
    one_over = _configmap({"a": "x" * half, "b": "y" * (half - 7)}, binary={"c": base64.b64encode(b"z" * 8).decode()})
    data = [p for p in ms.k8s_size_problems([one_over]) if "bytes of data" in p]
    assert data and data[0].startswith("ConfigMap big would hold 1,048,577 bytes of data, more than the 1,048,576 "
                                       "an API server admits in one ConfigMap; its largest items: a 524,288 bytes, "
                                       "b 524,281 bytes, c 8 bytes."), data
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "minimax-m3"},
                  "spec": {"x": "y" * API_ANNOTATIONS_MAX}}
    assert ms.k8s_size_problems([deployment])[0].endswith(
        "admits on one object: shorten the model_server_k8s_* and serving_* values it is rendered from.")


def test_the_cpu_lab_row_asks_for_no_gpu():
    lab = spec("cpu-lab", engine="vllm", image={"digest": SEED_DIGEST})
    objects = ms.k8s_manifests(lab, settings())
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["tolerations"] == [] and pod["containers"][0]["resources"] == {}
    # its least privilege carries over: nobody, read-only root, the tmpfs as a memory emptyDir
    security = pod["containers"][0]["securityContext"]
    assert security["runAsUser"] == 65534 and security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True and pod["securityContext"] == {
        "fsGroup": 65534, "seccompProfile": {"type": "RuntimeDefault"}}
    tmp = next(v for v in pod["volumes"] if v["name"] == "tmpfs-0")
    assert tmp == {"name": "tmpfs-0", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}


def test_the_unit_and_the_pod_share_one_argument_builder():
    """docker_run_argv ends with exactly what the pod's container runs after its image."""
    keyed = spec("h200", engine="vllm", image={"digest": SEED_DIGEST}, api_key="8f2c41d9e07b5a63c1f4e2d8b9a07c36", api_key_defined=True,
                 bind_address="0.0.0.0")
    assert keyed["auth"] and not keyed["blockers"]
    argv = ms.docker_run_argv(keyed, config_host_path="/etc/minimax-m3/engine.yaml",
                              config_container_path="/etc/model-server/engine.yaml")
    image, command, args = ms.k8s_exec(keyed, ms.engine_container_args(keyed, "/etc/model-server/engine.yaml"))
    assert command is None and argv[-len(args) - 1:] == [image] + args
    assert args[-2:] == ["--config", "/etc/model-server/engine.yaml"]
