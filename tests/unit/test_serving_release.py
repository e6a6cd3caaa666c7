"""A deployment is the signed release, or it is refused (issue 33): serving_resolve checks the
bundle against serving_release_keys/serving_release_revoked and binds it to what the spec runs -
weights, manifest pin, profile, engine, image, argv, environment - naming the parts that differ.
The release part is the one the plan writes (serving_release_part); the keys are openssl's."""
import json
import os

import pytest

from helpers import ROOT, load_source, openssl_ec_keys, serving_args

from ansible_collections.mm3.shared.plugins.module_utils import docker_run as dr  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402

serving = load_source("mm3_serving_filters", os.path.join(ROOT, "filter_plugins", "serving.py"))
DIGEST = "sha256:" + "0123456789abcdef" * 4
PIN = "c" * 64
BASE = dict(profile="h200", engine="vllm", image={"digest": DIGEST}, weights_revision="a" * 40,
            weights_manifest_sha256=PIN)
FILES = [("config.json", "1" * 64), ("model-00001-of-00001.safetensors", "2" * 64)]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return openssl_ec_keys(str(tmp_path_factory.mktemp("keys")))


def resolve(**kw):
    inputs = dict(BASE, release_today="2026-12-05")
    inputs.update(kw)
    return serving.serving_resolve(*serving_args(**inputs))


def signed_release(keys, key="site", **change):
    """What an operator signs: the plan's release part of BASE (with `change` applied)."""
    part = serving.release_part(resolve())
    part.update(change)
    return json.dumps(rs.sign(rs.statement("MiniMax-M3", FILES, release=part), keys[key][0]))


def listed(keys, **extra):
    return [dict({"name": "site-2026", "public_key": keys["site"][1]}, **extra)]


def test_the_signed_release_deploys_and_pins_the_manifest(keys):
    bundle = signed_release(keys)
    spec = resolve(release_bundle=bundle, release_keys=listed(keys))
    assert spec["blockers"] == []
    assert spec["release"]["key"] == "site-2026" and spec["release"]["files"] == 2
    # Without an inventory pin, the manifest pin is the signed one.
    spec = resolve(release_bundle=bundle, release_keys=listed(keys), weights_manifest_sha256=None)
    assert spec["blockers"] == [] and spec["weights"]["manifest_sha256"] == PIN


def test_no_keys_no_bundle_is_the_manifest_pin_alone():
    spec = resolve()
    assert spec["blockers"] == [] and spec["release"] is None


@pytest.mark.parametrize("case,inputs,fragment", [
    ("another image", dict(image={"digest": "sha256:" + "f" * 64}), "in: images."),
    ("another engine flag", dict(profile_overrides={"engines": {"vllm": {"args": [
        ["--tensor-parallel-size", "8"], ["--block-size", "64"], ["--max-model-len", "65536"],
        ["--reasoning-parser", "minimax_m3"], ["--tool-call-parser", "minimax_m3"], ["--enable-auto-tool-choice"],
        ["--gpu-memory-utilization", "0.80"]]}}}), "in: argv."),
    ("another output cap", dict(max_output_tokens=65536), "in: argv."),
    ("another revision", dict(weights_revision="b" * 40), "in: revision."),
    ("another manifest pin", dict(weights_manifest_sha256="d" * 64), "in: manifest_sha256."),
    ("another environment", dict(profile_overrides={"engines": {"vllm": {"env": {"NCCL_DEBUG": "INFO"}}}}), "in: env."),
    # the container's environment reaches the unit's -e too (engine_env), so it is signed as well
    ("another container environment", dict(profile_overrides={"engines": {"vllm": {"container": {
        "env": {"NCCL_DEBUG": "INFO"}}}}}), "in: env."),
    # a loosening the site allows (serving_allow_container_privileges) is still another release
    ("a capability added", dict(allow_container_privileges=True, profile_overrides={"engines": {"vllm": {
        "container": {"cap_add": ["SYS_PTRACE"]}}}}), "in: container."),
    ("a lower process limit", dict(profile_overrides={"engines": {"vllm": {"container": {"pids_limit": 4096}}}}),
     "in: container."),
])
def test_a_deployment_that_is_not_the_signed_release_is_refused_naming_the_part(keys, case, inputs, fragment):
    text = "\n".join(resolve(release_bundle=signed_release(keys), release_keys=listed(keys), **inputs)["blockers"])
    assert "this deployment differs from the signed release" in text and fragment in text, (case, text)
    assert "Deploy what was signed, or plan again and have the new release-part.json signed." in text


@pytest.mark.parametrize("case,inputs,fragment", [
    ("keys but no bundle", dict(release_bundle=None), "no signed release is given: set serving_release_bundle"),
    ("a bundle but no keys", dict(release_keys=[]), "serving_release_bundle is set but serving_release_keys is empty"),
    ("an unknown key", dict(release_keys="stranger"), "which is not in release_keys"),
    ("a revoked key", dict(release_revoked=["site-2026"]), "which release_revoked revokes"),
    ("an expired key", dict(release_keys="expired"), "expired on 2026-11-30"),
    ("a malformed bundle", dict(release_bundle="{not json"), "the signature is not JSON"),
    ("a key in the wrong format", dict(release_keys="private"), "is not a PEM public key"),
    ("revocations not a list", dict(release_revoked="site-2026"), "serving_release_revoked is a str"),
])
def test_a_release_that_cannot_be_trusted_is_refused(keys, case, inputs, fragment):
    named = {"stranger": [{"name": "stranger", "public_key": keys["stranger"][1]}],
             "expired": listed(keys, not_after="2026-11-30"),
             "private": [{"name": "site-2026", "public_key": keys["site"][0].decode()}]}
    if isinstance(inputs.get("release_keys"), str):
        inputs = dict(inputs, release_keys=named[inputs["release_keys"]])
    kw = dict(release_bundle=signed_release(keys), release_keys=listed(keys))
    kw.update(inputs)
    text = "\n".join(resolve(**kw)["blockers"])
    assert fragment in text, (case, text)


def test_a_weights_only_bundle_is_refused(keys):
    bundle = json.dumps(rs.sign(rs.statement("MiniMax-M3", FILES), keys["site"][0]))
    text = "\n".join(resolve(release_bundle=bundle, release_keys=listed(keys))["blockers"])
    assert "holds the weights only (no mm3_release part" in text, text


def test_the_release_part_is_what_the_unit_runs():
    spec = resolve()
    part = serving.release_part(spec)
    assert part["argv"] == spec["command"] and part["images"] == [spec["image"]["ref"]]
    assert "--override-generation-config" in part["argv"]  # the output cap is part of what is signed
    assert part["manifest_sha256"] == PIN and part["revision"] == "a" * 40
    # the device and least-privilege options, as the unit's docker run has them
    assert part["container"] == ["--gpus", "all", "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
                                 "--pids-limit", "16384"]
    ms_filters = load_source("mm3_model_server_filters", os.path.join(ROOT, "filter_plugins", "model_server.py"))
    unit = ms_filters.docker_run_argv(spec, config_host_path="/etc/minimax-m3/engine.yaml",
                                      config_container_path="/etc/minimax-m3/engine.yaml")
    assert dr.container_differences(dr.parse_run(unit), part["container"]) == []


def test_the_release_names_its_evaluation_set_and_the_spec_carries_the_signed_one(keys):
    """The plan passes the set (role serving_verify's release_eval_set); the serving resolution does
    not judge it (verify.yml does, before it runs the set) but hands the signed one on."""
    named = {"name": "site-evals", "version": 3, "pass_threshold": 0.9, "cases": 12, "sha256": "5" * 64}
    assert serving.release_part(resolve())["eval_set"] is None
    assert serving.release_part(resolve(), named)["eval_set"] == named
    bundle = signed_release(keys, eval_set=named)
    spec = resolve(release_bundle=bundle, release_keys=listed(keys))
    assert spec["blockers"] == [] and spec["release"]["eval_set"] == named
    assert json.loads(rs.envelope(bundle)[0])["predicate"]["mm3_release"]["version"] == 3


POLICY = {"clients": [{"name": "app", "requests_per_minute": 600, "concurrent": 16, "max_body_bytes": 2097152,
                       "max_tokens": 8192}], "allowed_networks": ["10.20.0.0/16"], "metrics_networks": [],
          "media_allowlist": [], "client_paths": [{"path": "/v1/chat/completions", "methods": ["POST"], "body": True}]}


def test_the_release_binds_the_gateway_policy(keys):
    """With a gateway in front, what it lets clients do is part of the release: another limit, a
    new client or network, or no gateway at all differs in gateway_policy, refused before anything
    changes; without a gateway the part is null."""
    gated = dict(gateway=True, bind_address="127.0.0.1", gateway_policy=POLICY)
    part = serving.release_part(resolve(**gated))
    assert part["gateway_policy"] == POLICY and serving.release_part(resolve())["gateway_policy"] is None
    bundle = json.dumps(rs.sign(rs.statement("MiniMax-M3", FILES, release=part), keys["site"][0]))
    assert resolve(release_bundle=bundle, release_keys=listed(keys), **gated)["blockers"] == []
    wider = dict(POLICY, media_allowlist=["images.example"])
    for inputs in (dict(gated, gateway_policy=wider), dict(gated, gateway_policy=None),
                   dict(gated, gateway=False, bind_address="0.0.0.0", api_key="k" * 40)):
        text = "\n".join(resolve(release_bundle=bundle, release_keys=listed(keys), **inputs)["blockers"])
        assert "differs from the signed release" in text and "in: gateway_policy." in text, (inputs, text)
    # a release signed without a gateway is refused behind one
    text = "\n".join(resolve(release_bundle=signed_release(keys), release_keys=listed(keys), **gated)["blockers"])
    assert "in: gateway_policy." in text, text
    # the policy is not read without a gateway
    assert resolve(gateway_policy=POLICY)["gateway_policy"] is None


def test_the_status_line_names_the_key_the_refusal_or_unsigned(keys):
    """playbooks/status.yml's part on the signed release (serving_release_line)."""
    bundle = signed_release(keys)
    line = serving.release_line(resolve(release_bundle=bundle, release_keys=listed(keys)))
    assert line.startswith("signed by key site-2026 (release ") and len(line.split("release ")[1]) == 17, line
    line = serving.release_line(resolve(release_bundle=bundle, release_keys=listed(keys), release_revoked=["site-2026"]))
    assert line.startswith("signed release REFUSED: ") and "release_revoked revokes" in line, line
    line = serving.release_line(resolve(release_bundle=bundle, release_keys=listed(keys), max_output_tokens=300))
    assert "REFUSED" in line and "in: argv." in line, line
    assert serving.release_line(resolve()) == "unsigned (the manifest pin is the anchor)"
    # a refusal that is not about the release is not the release's
    assert serving.release_line(resolve(weights_revision="not-a-sha")) == "unsigned (the manifest pin is the anchor)"
    line = serving.release_line(resolve(release_bundle=bundle, release_keys=listed(keys), release_revoked=["site-2026"]))
    assert line.startswith("signed release REFUSED: the release is signed by key 'site-2026'"), line


def test_diagnose_names_a_refused_release_and_its_key(keys):
    """playbooks/diagnose.yml on a node whose signed release no longer verifies: the serving role
    collects the refusal (it does not stop the diagnosis), the diagnose role writes the status line
    as a state line, and the table's release_refused rule leads with the key that was revoked."""
    import yaml
    diagnose = load_source("mm3_diagnose_filters", os.path.join(ROOT, "filter_plugins", "diagnose.py"))
    with open(os.path.join(ROOT, "roles", "diagnose", "vars", "main.yml")) as handle:
        rules = yaml.safe_load(handle)["__diagnose_rules"]
    bundle = signed_release(keys)

    def findings(spec):
        evidence = diagnose.diagnose_evidence({"release": serving.release_line(spec)})
        return evidence["state"], diagnose.diagnose_findings(evidence, rules)

    state, found = findings(resolve(release_bundle=bundle, release_keys=listed(keys), release_revoked=["site-2026"]))
    assert [f["id"] for f in found] == ["release_refused"], state
    assert "signed by key 'site-2026'" in found[0]["evidence"][0]["line"]
    assert "release_revoked revokes" in found[0]["evidence"][0]["line"]
    state, found = findings(resolve(release_bundle=bundle, release_keys=listed(keys)))
    assert found == [] and state.startswith("release: signed by key site-2026 (release "), state
    state, found = findings(resolve())
    assert found == [] and state == "release: unsigned (the manifest pin is the anchor)"


def test_a_release_gives_the_pins_the_inventory_leaves_unset(keys):
    """rollout.yml and rollback.yml take a release in place of the separate pins: with no weights
    revision, manifest pin or image digest in the inventory (the role's defaults), they are the
    signed release's, not the matrix's; a pin the inventory sets still wins and must be the signed
    one; a release that does not verify gives nothing."""
    unpinned = dict(weights_revision="", weights_manifest_sha256="", image={})
    repository = resolve()["image"]["repository"]
    other_revision, other_digest = "b" * 40, "sha256:" + "fedcba9876543210" * 4
    bundle = signed_release(keys, revision=other_revision, images=["%s@%s" % (repository, other_digest)])
    spec = resolve(release_bundle=bundle, release_keys=listed(keys), **unpinned)
    assert spec["blockers"] == []
    assert spec["weights"]["revision"] == other_revision and spec["weights"]["manifest_sha256"] == PIN
    assert spec["weights"]["dir"].endswith("/" + other_revision)  # the layout (sync, mount) follows
    assert spec["image"]["ref"] == "%s@%s" % (repository, other_digest)
    assert spec["release"]["key"] == "site-2026"
    # the inventory's pin wins, and is refused where it is not the signed one
    spec = resolve(release_bundle=bundle, release_keys=listed(keys), **dict(unpinned, weights_revision="a" * 40))
    assert any("in: revision" in b for b in spec["blockers"]), spec["blockers"]
    spec = resolve(release_bundle=bundle, release_keys=listed(keys), **dict(unpinned, image={"digest": DIGEST}))
    assert any("in: images" in b for b in spec["blockers"]), spec["blockers"]
    # a revoked key's release gives no pins (and is refused)
    spec = resolve(release_bundle=bundle, release_keys=listed(keys), release_revoked=["site-2026"], **unpinned)
    assert spec["weights"]["revision"] != other_revision and spec["image"]["digest"] != other_digest
    assert any("release_revoked revokes" in b for b in spec["blockers"]), spec["blockers"]


def test_rollback_refuses_a_kept_release_whose_key_no_longer_stands(keys):
    """rollback.yml with release keys listed: the kept release's history entry records what
    serving_resolve verified when it was deployed (release.signed = spec['release']); the key
    must still be listed, not revoked and valid, and the release not revoked (rs.standing, the
    check every bundle gets). An unsigned kept release is refused; without keys nothing is."""
    release_filters = load_source("mm3_release_filters", os.path.join(ROOT, "filter_plugins", "release.py"))
    problem = release_filters.release_signature_problem
    spec = resolve(release_bundle=signed_release(keys), release_keys=listed(keys))
    entry = {"id": "0123456789abcdef", "release": {"revision": "a" * 40, "signed": spec["release"]}}
    today = "2026-12-05"
    assert problem(entry, listed(keys), [], today) == ""
    assert problem(entry, [], ["site-2026"], today) == ""  # no keys: the manifest pin is the anchor
    assert "which release_revoked revokes" in problem(entry, listed(keys), ["site-2026"], today)
    assert "is revoked (release_revoked)" in problem(entry, listed(keys), [spec["release"]["digest"]], today)
    assert "expired on 2026-11-30" in problem(entry, listed(keys, not_after="2026-11-30"), [], today)
    stranger = [{"name": "other", "public_key": keys["stranger"][1]}]
    assert "no longer in serving_release_keys" in problem(entry, stranger, [], today)
    unsigned = {"id": "fedcba9876543210", "release": {"revision": "a" * 40, "signed": None}}
    assert "deployed without a signed release" in problem(unsigned, listed(keys), [], today)
    assert problem(unsigned, [], [], today) == ""
