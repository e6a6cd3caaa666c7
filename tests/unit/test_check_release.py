"""The signed release is checked again on the node at every engine start (issue 33): the unit's
ExecStartPre runs check_release.py, offline, against the trust file the role writes
(release-trust.json) and the weights manifest on the node. These tests run the installed form
(the script and the shared code laid out by model_server_helper_files), with the argv the unit
template renders for a serving_spec that serving_resolve produced from a real signed bundle,
and the trust file as model_server writes it (serving_spec.release_trust)."""
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import jinja2
import pytest
from ansible.plugins.filter import core as ansible_core_filters

from ansible.errors import AnsibleFilterError

from helpers import (API_ANNOTATIONS_MAX, ROOT, applied_annotations_size, install_node_checks, k8s_settings,
                     load_source, openssl_ec_keys, serving_args)

from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402

serving = load_source("mm3_serving_filters", os.path.join(ROOT, "filter_plugins", "serving.py"))
ms_filters = load_source("model_server_filters", os.path.join(ROOT, "filter_plugins", "model_server.py"))
CHECKER = os.path.join(ROOT, "roles", "model_server", "files", "check_release.py")
UNIT_TEMPLATE = os.path.join(ROOT, "roles", "model_server", "templates", "model-server.service.j2")
FILES = [("config.json", "1" * 64), ("model-00001-of-00001.safetensors", "2" * 64)]
MANIFEST = "".join("%s  %s\n" % (digest, name) for name, digest in FILES).encode()
PIN = hashlib.sha256(MANIFEST).hexdigest()
BASE = dict(profile="h200", engine="vllm", image={"digest": "sha256:" + "0123456789abcdef" * 4},
            weights_revision="a" * 40, weights_manifest_sha256=PIN, release_today="2026-12-05")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return openssl_ec_keys(str(tmp_path_factory.mktemp("keys")))


def resolve(**kw):
    return serving.serving_resolve(*serving_args(**dict(BASE, **kw)))


def bundle_of(keys, key="site", files=FILES):
    part = serving.release_part(resolve())
    return json.dumps(rs.sign(rs.statement("MiniMax-M3", files, release=part), keys[key][0]))


def listed(keys, **extra):
    return [dict({"name": "site-2026", "public_key": keys["site"][1]}, **extra)]


UNIT = "minimax-m3.service"
CONFIG_IN_CONTAINER = "/etc/model-server/engine.yaml"


def unit_argv(spec, python, libexec, bundle_file, trust_file):
    """The argv of the unit's release check as the role renders it: the template's ExecStartPre
    line that runs check_release.py, from serving_spec, split the way systemd reads it."""
    text = pathlib.Path(UNIT_TEMPLATE).read_text()
    expression = re.search(r"^ExecStartPre=(\{\{(?:(?!\}\}).)*check_release\.py.*?\}\})$", text, re.S | re.M)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(ansible_core_filters.FilterModule().filters())  # to_json, regex_replace as Ansible's
    env.filters["model_server_systemd_join"] = ms_filters.systemd_join
    line = env.from_string(expression.group(1)).render(
        serving_spec=spec, model_server_python=python, model_server_libexec_dir=libexec,
        __model_server_release_bundle_file=bundle_file, __model_server_release_trust_file=trust_file,
        model_server_service_name=UNIT[:-len(".service")],
        __model_server_config_in_container=CONFIG_IN_CONTAINER)
    return ms_filters.command_tokens(line)


def exec_start_argv(spec, image_ref=None):
    """ExecStart's argv as model_server renders it for `spec` (render.yml's model_server_docker_argv,
    the unit's docker binary first), the image under `image_ref` (image_carry's tag) if given."""
    if image_ref:
        spec = dict(spec, image=dict(spec["image"], ref=image_ref))
    argv = ms_filters.docker_run_argv(spec, name="minimax-m3", shm_size="32g", config_host_path="/etc/minimax-m3/engine.yaml",
                                      config_container_path=CONFIG_IN_CONTAINER, docker_bin="docker",
                                      jit_cache_dir="/var/cache/minimax-m3/jit/abc")
    return ["/usr/bin/docker"] + argv[1:]


# What busctl --json=short get-property org.freedesktop.systemd1 <unit path>
# org.freedesktop.systemd1.Service ExecStart answers (a(sasbttttuii): path, argv, ignore failure,
# start/exit timestamps, pid, code, status).
def busctl_reply(argv):
    return {"type": "a(sasbttttuii)", "data": [[argv[0], argv, False, 0, 0, 0, 0, 0, 0, 0]]}


def standin_busctl(tmp_path, reply):
    """STAND-IN for systemd's busctl (no system bus on the test machine): prints `reply` for the
    ExecStart of the unit's object path, fails for anything else. The lab runs the real one."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (tmp_path / "busctl-reply.json").write_text(json.dumps(reply))
    script = bindir / "busctl"
    script.write_text("#!/bin/sh\n"
                      "[ \"$*\" = \"--json=short get-property org.freedesktop.systemd1 "
                      "/org/freedesktop/systemd1/unit/minimax_2dm3_2eservice org.freedesktop.systemd1.Service ExecStart\" ] "
                      "|| { echo \"standin busctl: unexpected call: $*\" >&2; exit 1; }\n"
                      "cat %s\n" % (tmp_path / "busctl-reply.json"))
    script.chmod(0o755)
    return str(bindir)


def install(tmp_path):
    libexec = tmp_path / "libexec"
    install_node_checks(str(libexec), [CHECKER])
    return libexec


def node(tmp_path, spec, trust=None, bundle=None, manifest=MANIFEST, exec_argv=None, reply=None):
    """A node as model_server leaves it (bundle, trust file, manifest, the unit's ExecStart: busctl's
    `reply`, else exec_argv's, else the rendered one), then the unit's check run on it:
    (returncode, stderr + stdout)."""
    libexec = install(tmp_path)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "release.sigstore.json").write_text(bundle if bundle is not None else spec["release_bundle"])
    trust = trust if trust is not None else spec["release_trust"]
    (etc / "release-trust.json").write_text(trust if isinstance(trust, str) else json.dumps(trust))
    man = tmp_path / "weights.manifest.sha256"
    man.write_bytes(manifest)
    bindir = standin_busctl(tmp_path, reply or busctl_reply(exec_argv or exec_start_argv(spec)))
    spec = dict(spec, weights=dict(spec["weights"], manifest=str(man)))
    argv = unit_argv(spec, sys.executable, str(libexec), str(etc / "release.sigstore.json"),
                     str(etc / "release-trust.json"))
    run = subprocess.run(argv, capture_output=True, text=True,
                         env=dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"]))
    return run.returncode, run.stderr + run.stdout


def test_the_signed_release_starts(tmp_path, keys):
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys))
    assert spec["blockers"] == [] and spec["release_trust"]["revoked"] == []
    rc, out = node(tmp_path, spec)
    assert rc == 0, out
    assert "signed release %s verified on this node" % spec["release"]["digest"][:16] in out


def test_an_unsigned_release_renders_no_release_check():
    spec = resolve()
    assert spec["release"] is None and spec["release_bundle"] is None and spec["release_trust"] is None
    unit = pathlib.Path(UNIT_TEMPLATE).read_text()
    assert "{% if serving_spec.release %}" in unit.split("check_release.py")[0].rsplit("ExecStartPre=", 1)[0]


def test_the_trust_file_is_the_inventorys_keys_less_its_revocations(keys):
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys, not_after="2027-06-30"),
                   release_revoked=["  OLD-KEY "])
    trust = spec["release_trust"]
    assert trust["revoked"] == ["old-key"]
    assert [(k["name"], k["not_before"], k["not_after"]) for k in trust["keys"]] == [("site-2026", None, "2027-06-30")]
    assert rs.load_public_key(trust["keys"][0]["public_key"])
    # a revoked key still yields the trust (release-trust.yml pushes it), not the release
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys), release_revoked=["site-2026"])
    assert spec["release"] is None and spec["release_trust"]["revoked"] == ["site-2026"]
    # a revocation entry that is not a string is refused by the controller's verification too, so
    # no release deploys without a trust file for the node's start check
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys), release_revoked=[42])
    assert spec["release"] is None and spec["release_trust"] is None
    assert any("release_revoked holds 42" in b for b in spec["blockers"]), spec["blockers"]
    # keys the controller refuses yield none
    assert resolve(release_keys=[{"name": "x", "public_key": "not a key"}])["release_trust"] is None


# What a start finds changed since the release was signed and trusted: the same cases for the
# node's unit and the Kubernetes pod.
REFUSED_STARTS = [
    ("key revoked since (release-trust.yml)", "key 'site-2026'"),
    ("release revoked since", "is revoked (release_revoked)"),
    ("key expired on the node's clock", "expired on 2020-01-01"),
    ("bundle signed by a key not listed", "which is not in release_keys"),
    ("bundle of another release", "not the release"),
    ("bundle edited after signing", "does not verify"),
    ("manifest of another revision", "is not the signed one"),
    ("trust file not JSON", "the trust file is not JSON"),
]


def changed_since(keys, spec, bundle, case):
    """(trust, bundle, manifest) a start finds for `case` (None: as rendered)."""
    trust, other_bundle, manifest = None, None, MANIFEST
    if case.startswith("key revoked"):
        trust = rs.trust_document(listed(keys), ["site-2026"])
    elif case.startswith("release revoked"):
        trust = rs.trust_document(listed(keys), [spec["release"]["digest"]])
    elif case.startswith("key expired"):
        trust = rs.trust_document(listed(keys, not_before="2019-01-01", not_after="2020-01-01"))
    elif case.startswith("bundle signed by a key not listed"):
        other_bundle = bundle_of(keys, key="stranger")
    elif case.startswith("bundle of another release"):
        other_bundle = bundle_of(keys, files=FILES[:1] + [("extra.json", "3" * 64)] + FILES[1:])
    elif case.startswith("bundle edited"):
        doc = json.loads(bundle)
        payload = json.loads(rs.envelope(bundle)[0])
        payload["predicate"]["mm3_release"]["argv"].append("--enforce-eager")
        doc["dsseEnvelope"]["payload"] = __import__("base64").b64encode(rs.payload_bytes(payload)).decode()
        other_bundle = json.dumps(doc)
    elif case.startswith("manifest"):
        manifest = MANIFEST + b"%s  extra.json\n" % (b"3" * 64)
    elif case.startswith("trust file"):
        trust = "{"
    return trust, other_bundle, manifest


@pytest.mark.parametrize("case,fragment", REFUSED_STARTS)
def test_the_node_refuses_to_start(tmp_path, keys, case, fragment):
    bundle = bundle_of(keys)
    spec = resolve(release_bundle=bundle, release_keys=listed(keys))
    trust, other_bundle, manifest = changed_since(keys, spec, bundle, case)
    rc, out = node(tmp_path, spec, trust=trust, bundle=other_bundle, manifest=manifest)
    assert rc == 1, out
    assert out.startswith("minimax-m3: refusing to start: ") and fragment in out, out


def test_a_missing_trust_file_refuses(tmp_path, keys):
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys))
    libexec = install(tmp_path)
    (tmp_path / "bundle").write_text(spec["release_bundle"])
    argv = unit_argv(spec, sys.executable, str(libexec), str(tmp_path / "bundle"), str(tmp_path / "no-trust"))
    run = subprocess.run(argv, capture_output=True, text=True)
    assert run.returncode == 1 and "cannot read the release trust" in run.stderr, run.stderr


def test_the_manifest_signed_but_listing_other_files_refuses(keys):
    """problems() compares the signed files with the manifest even when its hash is the signed
    one (a statement whose resources and manifest_sha256 disagree is refused by name)."""
    checker = load_source("check_release_mod", CHECKER)
    part = serving.release_part(resolve())
    other = FILES[:1] + [("model-00001-of-00001.safetensors", "9" * 64)]
    bundle = json.dumps(rs.sign(rs.statement("MiniMax-M3", other, release=part), keys["site"][0]))
    trust = json.dumps(rs.trust_document(listed(keys)))
    digest = rs.release_digest(rs.envelope(bundle)[0])
    problem = checker.problems(bundle, trust, digest, MANIFEST, today="2026-12-05")
    assert "with another sha256 than the signed one: model-00001-of-00001.safetensors" in problem


def _edit(argv, old, new):
    index = argv.index(old)
    return argv[:index] + new + argv[index + 1:]


@pytest.mark.parametrize("case,fragment", [
    ("image swapped", "images: the unit runs vllm/vllm-openai@sha256:ffff"),
    ("engine flag edited", "argv: token 5 (after --tensor-parallel-size) is '4' where the signed release has '8'"),
    ("engine flag added", "argv: it adds '--enforce-eager' after the signed argv"),
    ("variable added", "env: VLLM_ATTENTION_BACKEND=FLASHINFER is not signed"),
    ("signed variable changed", "env: HF_HUB_OFFLINE=0 is not signed; the signed HF_HUB_OFFLINE=1 is missing"),
    ("variable set twice", "env: HF_HUB_OFFLINE is set 2 times"),
    ("entrypoint replaced", "argv: the unit's entrypoint is /bin/sh, the signed release's the image's"),
    ("docker option unknown to the check", "option --foo, which this check does not know"),
    ("a drop-in adds a second ExecStart", "the unit has 2 ExecStart commands"),
    ("weights mounted from another directory", "mounts: -v /srv/other:/models/MiniMax-M3:ro mounts /srv/other at "
                                               "/models/MiniMax-M3, where the engine reads the verified weights"),
    ("weights mounted writable", "mounts /data/models/MiniMaxAI/MiniMax-M3/%s at /models/MiniMax-M3 writable" % ("a" * 40)),
    ("a file mounted over a shard", "mounts /tmp/evil at /models/MiniMax-M3/model-00001-of-00001.safetensors"),
    ("a tmpfs over the weights", "--tmpfs /models/MiniMax-M3/ mounts a tmpfs at /models/MiniMax-M3"),
    ("another container's volumes", "--volumes-from other brings another container's mounts"),
    ("no weights mounted", "nothing is mounted at /models/MiniMax-M3"),
    ("privileged", "container: the unit adds --privileged"),
    ("a capability added", "container: the unit adds --cap-add SYS_ADMIN"),
    ("the process limit raised", "container: the unit adds --pids-limit 99999; lacks --pids-limit 16384"),
    ("capabilities kept", "container: the unit lacks --cap-drop ALL"),
    ("root", "container: the unit adds --user 0"),
    ("a device added", "container: the unit adds --device /dev/mem"),
    ("the GPUs dropped", "container: the unit lacks --gpus all"),
    ("no-new-privileges dropped", "container: the unit lacks --security-opt no-new-privileges"),
])
def test_the_node_refuses_a_unit_that_does_not_run_the_signed_release(tmp_path, keys, case, fragment):
    """The unit's ExecStart as systemd holds it (a drop-in or a hand edit included) must run the
    signed image, environment and engine argv: the drill's swapped image and edited flag, refused
    on the node and naming the part."""
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys))
    argv = exec_start_argv(spec)
    image = spec["image"]["ref"]
    after = argv[argv.index(image) + 1:]
    reply = None
    if case == "image swapped":
        argv = exec_start_argv(spec, image_ref="vllm/vllm-openai@sha256:" + "f" * 64)
    elif case == "engine flag edited":
        assert after[3:5] == ["--tensor-parallel-size", "8"]
        argv = argv[:argv.index(image) + 5] + ["4"] + argv[argv.index(image) + 6:]
    elif case == "engine flag added":
        argv = argv + ["--enforce-eager"]
    elif case == "variable added":
        argv = argv[:2] + ["-e", "VLLM_ATTENTION_BACKEND=FLASHINFER"] + argv[2:]
    elif case == "signed variable changed":
        argv = _edit(argv, "HF_HUB_OFFLINE=1", ["HF_HUB_OFFLINE=0"])
    elif case == "variable set twice":
        argv = argv[:2] + ["--env=HF_HUB_OFFLINE=1"] + argv[2:]
    elif case == "entrypoint replaced":
        argv = _edit(argv, image, ["--entrypoint", "/bin/sh", image])
    elif case == "docker option unknown to the check":
        argv = argv[:2] + ["--foo"] + argv[2:]
    elif case == "a drop-in adds a second ExecStart":
        reply = busctl_reply(argv)
        reply["data"].append(reply["data"][0])
    elif case.startswith("weights mounted") or case == "no weights mounted":
        mount = "%s:%s:ro" % (spec["weights"]["dir"], spec["weights"]["container_dir"])
        new = {"weights mounted from another directory": ["-v", "/srv/other:%s:ro" % spec["weights"]["container_dir"]],
               "weights mounted writable": ["-v", mount[:-3]], "no weights mounted": []}[case]
        argv = argv[:argv.index(mount) - 1] + new + argv[argv.index(mount) + 1:]
    elif case == "a file mounted over a shard":
        argv = argv[:2] + ["-v", "/tmp/evil:%s/%s:ro" % (spec["weights"]["container_dir"], FILES[1][0])] + argv[2:]
    elif case == "a tmpfs over the weights":
        argv = argv[:2] + ["--tmpfs", spec["weights"]["container_dir"] + "/"] + argv[2:]
    elif case == "another container's volumes":
        argv = argv[:2] + ["--volumes-from", "other"] + argv[2:]
    elif case in ("privileged", "a capability added", "root", "a device added"):
        argv = argv[:2] + {"privileged": ["--privileged"], "a capability added": ["--cap-add=SYS_ADMIN"],
                           "root": ["-u", "0"], "a device added": ["--device", "/dev/mem"]}[case] + argv[2:]
    elif case == "the process limit raised":
        argv = _edit(argv, "16384", ["99999"])
    elif case == "capabilities kept":
        index = argv.index("--cap-drop")
        argv = argv[:index] + argv[index + 2:]
    elif case == "the GPUs dropped":
        index = argv.index("--gpus")
        argv = argv[:index] + argv[index + 2:]
    elif case == "no-new-privileges dropped":
        index = argv.index("no-new-privileges")
        argv = argv[:index - 1] + argv[index + 1:]
    rc, out = node(tmp_path, spec, exec_argv=argv, reply=reply)
    assert rc == 1, out
    assert out.startswith("minimax-m3: refusing to start: ") and fragment in out, out


def test_the_node_starts_the_signed_image_under_image_carrys_tag(tmp_path, keys):
    """docker load keeps no repo digest: the unit runs repository:pinned-<hex> (image_carry's tag,
    serving's image_local_tag), which names the signed digest; the JIT cache's variables are the
    unit's own, not the release's."""
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys))
    assert rs.image_names(spec["image"]["ref"])[1] == spec["image"]["local_tag"]
    argv = exec_start_argv(spec, image_ref=spec["image"]["local_tag"])
    assert any(token.split("=", 1)[0] in spec["jit_cache"]["env"] for token in argv), "no JIT variable to allow"
    rc, out = node(tmp_path, spec, exec_argv=argv)
    assert rc == 0, out


def test_the_weights_mounted_with_docker_mount_start(tmp_path, keys):
    """The verified weights may be mounted with --mount's CSV as well as -v: what counts is the
    directory, the target and read-only, as Docker reads them."""
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys))
    argv = exec_start_argv(spec)
    mount = "%s:%s:ro" % (spec["weights"]["dir"], spec["weights"]["container_dir"])
    index = argv.index(mount)
    csv = "type=bind,src=%s/,dst=%s,readonly" % (spec["weights"]["dir"], spec["weights"]["container_dir"])
    rc, out = node(tmp_path, spec, exec_argv=argv[:index - 1] + ["--mount", csv] + argv[index + 1:])
    assert rc == 0, out


def test_docker_mounts_are_read_as_docker_reads_them():
    from ansible_collections.mm3.shared.plugins.module_utils import docker_run as dr
    parsed = dr.parse_run(["docker", "run", "-v", "/w:/models:ro,z", "--volume=cache:/c", "-v", "/anon",
                           "--mount", "type=bind,source=/w,target=/models/x/../y,ro=true",
                           "--mount=type=volume,dst=/v", "--tmpfs", "/t:size=1g", "--volumes-from", "c1", "img"])
    got = [(m["option"], m["type"], m["source"], m["target"], m["readonly"]) for m in dr.mounts(parsed)]
    assert got == [("-v", "bind", "/w", "/models", True), ("--volume", "volume", "cache", "/c", False),
                   ("-v", "volume", None, "/anon", False), ("--mount", "bind", "/w", "/models/y", True),
                   ("--mount", "volume", None, "/v", False), ("--tmpfs", "tmpfs", None, "/t", False),
                   ("--volumes-from", "volumes-from", "c1", None, False)]
    # beside the weights, other mounts (the engine's key file, the JIT cache) are not the check's
    assert rs.mount_differences(dr.parse_run(["docker", "run", "-v", "/w:/models:ro", "-v", "/etc/k:/etc/k:ro",
                                              "-v", "/jit:/root/.cache", "img"]), "/w/", "/models") == []
    assert rs.mount_differences(dr.parse_run(["docker", "run", "-v", "/w:/models:ro", "-v", "/w:/models:ro", "img"]),
                                "/w", "/models")[0].startswith("-v /w:/models:ro mounts /w at /models")


def test_privilege_options_are_compared_as_docker_reads_them():
    """--flag and --flag=true are one thing, --flag=false another; -u is --user; a repeated option
    counts each time; options outside PRIVILEGE_OPTIONS (ports, names, mounts) are not compared."""
    from ansible_collections.mm3.shared.plugins.module_utils import docker_run as dr
    signed = ["--gpus", "all", "--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--read-only",
              "--user", "65534:65534"]

    def differ(*options):
        return dr.container_differences(dr.parse_run(["docker", "run"] + list(options) + ["IMAGE", "serve"]), signed)
    assert differ("--gpus=all", "--security-opt=no-new-privileges", "--cap-drop", "ALL", "--read-only=true",
                  "-u", "65534:65534", "-p", "127.0.0.1:8000:8000", "--name", "x", "-v", "/a:/b:ro") == []
    assert differ("--gpus", "all", "--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--read-only=false",
                  "--user", "65534:65534") == ["adds --read-only=false", "lacks --read-only"]
    assert differ("--gpus", "all", "--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--read-only",
                  "--user", "65534:65534", "--user", "0") == ["adds --user 0"]
    assert differ("--gpus", "all", "--gpus", "all", "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
                  "--read-only", "--user", "65534:65534", "--pid=host") == ["adds --gpus all", "adds --pid host"]
    assert dr.container_differences(dr.parse_run(["docker", "run", "IMAGE"]), ["--bogus"])[0].startswith(
        "the signed container options cannot be read")


def test_docker_run_is_read_as_dockers_cli_reads_it():
    from ansible_collections.mm3.shared.plugins.module_utils import docker_run as dr
    parsed = dr.parse_run(["docker", "run", "--rm", "-eA=1", "-e=B=2", "--env", "C=3", "--ipc=host",
                           "-p", "127.0.0.1:1:2", "--", "img", "--port", "1"])
    assert parsed["image"] == "img" and parsed["args"] == ["--port", "1"]
    assert dr.option_values(parsed, "-e", "--env") == ["A=1", "B=2", "C=3"]
    for bad, said in ((["docker", "ps"], "is not `docker run"), (["docker", "run", "--rm"], "names no image"),
                      (["docker", "run", "-it", "img"], "one-letter options run together"),
                      (["docker", "run", "--name"], "has no value")):
        with pytest.raises(dr.RunError, match=said):
            dr.parse_run(bad)


def test_the_recorded_busctl_reply_reads_as_the_units_docker_run():
    """busctl's real reply (tests/fixtures/busctl, recorded on the lab's node1) is read by the
    check's own reader into an argv that parse_run reads as the lab's docker run."""
    from ansible_collections.mm3.shared.plugins.module_utils import docker_run as dr
    checker = load_source("check_release_mod", CHECKER)
    with open(os.path.join(ROOT, "tests", "fixtures", "busctl", "lab-node1-execstart.json")) as handle:
        reply = json.load(handle)
    assert reply["type"] == "a(sasbttttuii)" and len(reply["data"][0]) == 10
    argv = checker.exec_start(reply)
    parsed = dr.parse_run(argv)
    assert argv[0] == "/usr/bin/docker" and parsed["image"].startswith("127.0.0.1:5000/mm3-lab/vllm-cpu")
    assert "HF_HUB_OFFLINE=1" in dr.option_values(parsed, "-e") and parsed["args"][0] == "/models/tiny-m3"
    assert checker.unit_path("minimax-m3.service").endswith("/minimax_2dm3_2eservice")
    assert checker.unit_path("2x.service").endswith("/_32x_2eservice")


# The same check at every start of the engine's pod on Kubernetes (role model_server_k8s): its
# first init container runs check_release.py from a ConfigMap that holds the script, the shared
# code, the bundle and the trust list, against the manifest the pre-fill Job wrote into the weights
# volume. No cluster runs here (docs/operations/kubernetes.md): the test lays the ConfigMap's items
# out as the kubelet projects them and runs the init container's command with its mount paths
# mapped to where the volumes lie.
def pod_start(tmp_path, spec, trust=None, bundle=None, manifest=MANIFEST):
    """(returncode, output, the objects) of the engine pod's release check for `spec`."""
    objects = ms_filters.k8s_manifests(spec, k8s_settings())
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert init["name"] == "release-verified", "the pod's first init container is not the release check"
    volume = next(v for v in pod["volumes"] if v["name"] == "release")["configMap"]
    assert volume["name"] == config["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert all(m["readOnly"] for m in init["volumeMounts"])
    where = {mounts["release"]: tmp_path / "release", mounts["weights"]: tmp_path / "weights"}
    for item in volume["items"]:
        path = where[mounts["release"]] / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config["data"][item["key"]])
    if trust is not None:
        (where[mounts["release"]] / "release-trust.json").write_text(trust if isinstance(trust, str) else json.dumps(trust))
    if bundle is not None:
        (where[mounts["release"]] / "release.sig.json").write_text(bundle)
    where[mounts["weights"]].mkdir()
    (where[mounts["weights"]] / ("%s.manifest.sha256" % spec["weights"]["revision"])).write_bytes(manifest)

    def mapped(token):
        for mount, local in where.items():
            if token == mount or token.startswith(mount + "/"):
                return str(local) + token[len(mount):]
        return token
    assert init["command"][0] == "python3"
    argv = [sys.executable] + [mapped(token) for token in init["command"][1:]]
    env = dict(os.environ, **{e["name"]: e["value"] for e in init["env"]})
    run = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(tmp_path))
    return run.returncode, run.stderr + run.stdout, objects


def test_the_pod_starts_a_signed_release_and_its_objects_validate(tmp_path, keys):
    from kubernetes_validate import utils as kubernetes_validate
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys))
    rc, out, objects = pod_start(tmp_path, spec)
    assert rc == 0, out
    assert "signed release %s verified" % spec["release"]["digest"][:16] in out
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["minimax-m3/signed-release"] == spec["release"]["digest"]
    assert deployment["spec"]["template"]["spec"]["initContainers"][1]["name"] == "weights-verified"
    assert [o["kind"] for o in objects][:3] == ["Namespace", "ConfigMap", "PersistentVolumeClaim"]
    for version in ("1.30.0", "1.37.0"):
        for obj in objects:
            kubernetes_validate.validate(json.loads(json.dumps(obj)), version, strict=True)


@pytest.mark.parametrize("case,fragment", REFUSED_STARTS)
def test_the_pod_refuses_to_start(tmp_path, keys, case, fragment):
    bundle = bundle_of(keys)
    spec = resolve(release_bundle=bundle, release_keys=listed(keys))
    trust, other_bundle, manifest = changed_since(keys, spec, bundle, case)
    rc, out, _ = pod_start(tmp_path, spec, trust=trust, bundle=other_bundle, manifest=manifest)
    assert rc == 1, out
    assert out.startswith("minimax-m3: refusing to start: ") and fragment in out, out


def test_an_unsigned_release_has_no_release_check_in_the_pod_and_a_signed_one_needs_its_image(keys):
    objects = ms_filters.k8s_manifests(resolve(), k8s_settings())
    assert "ConfigMap" not in [o["kind"] for o in objects]
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]][:1] == ["weights-verified"]
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys))
    problems = ms_filters.k8s_problems(spec, k8s_settings(release_image=""))
    assert problems == ["model_server_k8s_release_image is empty: set it (an image with python3 and "
                        "python3-cryptography, by digest (registry/name@sha256:<64 hex>): the pod's first init "
                        "container checks the signed release in it at every start)."]
    assert ms_filters.k8s_problems(spec, k8s_settings(release_image="debian:12"))[0].startswith(
        "model_server_k8s_release_image is 'debian:12': set an image with python3")


def test_a_revocation_reaches_the_pods_as_release_trust_yml_patches_it(tmp_path, keys):
    """k8s.yml refuses a revoked release, so release-trust.yml merges the new trust list alone into
    the ConfigMap (kubernetes.core.k8s state=patched, a JSON merge patch): the patch names the
    ConfigMap the Deployment mounts, and with its trust list the pod's next start is refused."""
    spec = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys))
    objects = ms_filters.k8s_manifests(spec, k8s_settings())
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    revoked = resolve(release_bundle=bundle_of(keys), release_keys=listed(keys), release_revoked=["site-2026"])
    assert revoked["release"] is None and revoked["blockers"]   # the serving role stops k8s.yml there
    patch = ms_filters.k8s_release_trust(revoked, k8s_settings())
    assert {k: patch["metadata"][k] for k in ("name", "namespace")} == {
        k: config["metadata"][k] for k in ("name", "namespace")}
    assert set(patch["data"]) < set(config["data"])
    rc, out, _ = pod_start(tmp_path, spec, trust=patch["data"]["release-trust.json"])
    assert rc == 1 and "key 'site-2026'" in out, out


def shards(count):
    return [("model-%05d-of-%05d.safetensors" % (i + 1, count), "%064x" % (i + 1)) for i in range(count)]


def test_a_release_too_large_to_check_in_a_pod_is_refused_before_anything_is_applied(keys):
    """The pod's ConfigMap holds the check's code, the trust list and the bundle (about 250 bytes a
    file the release lists), and kubernetes.core.k8s apply: true records the whole object in an
    annotation, which an API server caps at 256 KiB an object. A release of 400 files renders and
    its ConfigMap fits once applied (measured with the collection's own annotate()); one of 700
    does not fit, and k8s_problems (which role model_server_k8s asserts before its first apply)
    refuses it, naming the limit, the bundle and where such a release is served instead."""
    spec = resolve(release_bundle=bundle_of(keys, files=shards(400)), release_keys=listed(keys))
    assert ms_filters.k8s_problems(spec, k8s_settings()) == []
    config = next(o for o in ms_filters.k8s_manifests(spec, k8s_settings()) if o["kind"] == "ConfigMap")
    assert applied_annotations_size(config) <= API_ANNOTATIONS_MAX
    big = resolve(release_bundle=bundle_of(keys, files=shards(700)), release_keys=listed(keys))
    assert big["release"] and not big["blockers"]
    problems = ms_filters.k8s_problems(big, k8s_settings())
    assert len(problems) == 1, problems
    assert problems[0].startswith("ConfigMap minimax-m3-release would carry ") and (
        "more than the 262,144 an API server admits on one object; its largest items: release.sig.json "
        in problems[0]) and "served from nodes (playbooks/site.yml)" in problems[0], problems
    with pytest.raises(AnsibleFilterError, match="refusing to render the Kubernetes objects: ConfigMap minimax-m3-release"):
        ms_filters.k8s_manifests(big, k8s_settings())
    unchecked = next(o for o in ms_filters._k8s_objects(big, k8s_settings()) if o["kind"] == "ConfigMap")
    assert applied_annotations_size(unchecked) > API_ANNOTATIONS_MAX   # what the API server would refuse
