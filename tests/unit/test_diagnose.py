"""filter_plugins/diagnose.py with the rule table of roles/diagnose/vars/main.yml, against
recorded log excerpts (tests/fixtures/diagnose/<rule>.log, each citing the real program and
thread its format comes from) and a healthy log recorded from the lab's real vLLM engine.

Every rule that reads a log has a recorded excerpt, and that excerpt leads to that rule first;
the healthy log leads to none; the state rules are driven by the state lines the role writes."""
import base64
import glob
import os
import urllib.parse

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from helpers import ROOT, load_source

diagnose = load_source("mm3_diagnose_filters", os.path.join(ROOT, "filter_plugins", "diagnose.py"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "diagnose")
with open(os.path.join(ROOT, "roles", "diagnose", "vars", "main.yml")) as _handle:
    RULES = yaml.safe_load(_handle)["__diagnose_rules"]
BY_ID = {rule["id"]: rule for rule in RULES}
LOG_SOURCES = ("engine", "kernel", "gateway")
# Rules no log line can show: the state or the verification report are their evidence.
STATE_ONLY = {"raw_parser_tokens", "health_fails", "gateway_down"}


def fixture(name):
    """The excerpt of a fixture without its header (lines starting '# ')."""
    with open(os.path.join(FIXTURES, name)) as handle:
        lines = handle.read().splitlines()
    header = [line for line in lines if line.startswith("# ")]
    body = [line for line in lines if not line.startswith("# ")]
    return header, "\n".join(body)


def recorded():
    return sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(FIXTURES, "*.log"))
                  if not os.path.basename(p).startswith("healthy"))


def evidence_for(rule_id, text):
    rule = BY_ID[rule_id]
    source = next(s for s in rule["sources"] if s in LOG_SOURCES)
    return {source: text}


def test_the_rule_table_is_usable():
    assert diagnose.diagnose_rules_problems(RULES) == []


def test_every_vendor_row_is_a_rule():
    # The seed's troubleshooting table has eight rows; each is one rule, in its order.
    vendor = [rule["id"] for rule in RULES if rule["table"] == "vendor"]
    assert vendor == ["cuda_oom", "weights_missing", "msa_jit_race", "msa_inactive", "nccl_timeout",
                      "raw_parser_tokens", "health_fails", "remote_image_refused"]


def test_every_fixture_cites_its_source():
    for name in recorded() + ["healthy-vllm-cpu"]:
        header, body = fixture(name + ".log")
        assert any(line.startswith("# source: ") for line in header), name
        assert body.strip(), name


def test_every_log_rule_has_a_recorded_excerpt():
    log_rules = {rule["id"] for rule in RULES if set(rule["sources"]) & set(LOG_SOURCES)} - STATE_ONLY
    missing = sorted(log_rules - set(recorded()) - set(NOT_RECORDED))
    assert missing == [], "rules without a recorded excerpt: %s" % missing


# Rules whose log line exists nowhere in a public recording we could find; the state evidence
# proves them instead (test_state_rules) and the closing note of issue 15 names them.
NOT_RECORDED = {"msa_inactive": "the gate's own line; SGLang prints nothing itself",
                "remote_image_refused": "the gateway's own access-log line (tests/test_gateway_haproxy.py)",
                "weights_marker_missing": "check_weights.py's own message (test_project_messages)",
                "weights_changed": "check_weights.py's own message (test_project_messages)",
                "weights_unreadable": "check_weights.py's own message (test_unreadable_weights_refusal)",
                "unit_start_limit": "systemd's message (test_project_messages)",
                "release_refused_at_start": "check_release.py's own message (test_release_start_refusal)"}


@pytest.mark.parametrize("rule_id", recorded())
def test_a_recorded_excerpt_leads_to_its_rule(rule_id):
    _header, text = fixture(rule_id + ".log")
    findings = diagnose.diagnose_findings(evidence_for(rule_id, text), RULES)
    assert findings, "no rule matched the recorded %s excerpt" % rule_id
    assert findings[0]["id"] == rule_id, [f["id"] for f in findings]


def test_the_real_engine_healthy_log_matches_nothing():
    _header, text = fixture("healthy-vllm-cpu.log")
    assert diagnose.diagnose_findings({"engine": text}, RULES) == []


def test_project_messages():
    # The project's own refusals, in the words roles/model_server/files/check_weights.py and
    # the shared weights_common.recheck print them (imported, not copied).
    from ansible_collections.mm3.shared.plugins.module_utils import weights_common as common
    no_marker = common.recheck("/nonexistent", b"", None, "0" * 64)
    line = ("minimax-m3: refusing to start: /data/models/x/y/rev is not what was verified: %s. Re-run "
            "playbooks/weights.yml (sync + verify) before starting the engine." % "; ".join(no_marker))
    assert diagnose.diagnose_findings({"engine": line}, RULES)[0]["id"] == "weights_marker_missing"
    hashed = "minimax-m3: refusing to start: /d is not what was verified: the manifest hashes to a, not to the pinned b."
    assert diagnose.diagnose_findings({"engine": hashed}, RULES)[0]["id"] == "weights_changed"
    # systemd 252's wording (src/core/unit.c, unit_start_limit_test -> log "Start request repeated too quickly.")
    limit = "minimax-m3.service: Start request repeated too quickly."
    assert diagnose.diagnose_findings({"engine": limit}, RULES)[0]["id"] == "unit_start_limit"


def test_unreadable_weights_refusal(tmp_path, capsys):
    """The refusal check_weights.py itself prints (run on a real directory the engine's uid
    cannot read: a verified copy whose shard is 0640 and owned by another user) leads to
    weights_unreadable, whose fix is the weights play."""
    import hashlib
    import json
    from ansible_collections.mm3.shared.plugins.module_utils import weights_common as common
    check = load_source("mm3_check_weights", os.path.join(ROOT, "roles", "model_server", "files", "check_weights.py"))
    wdir = tmp_path / "rev"
    wdir.mkdir()
    shard = wdir / "model-00001-of-00001.safetensors"
    shard.write_bytes(b"weights")
    manifest = ("%s  %s\n" % (hashlib.sha256(b"weights").hexdigest(), shard.name)).encode()
    (tmp_path / "m").write_bytes(manifest)
    pin = hashlib.sha256(manifest).hexdigest()
    (tmp_path / "k").write_text(json.dumps(common.marker_document(
        pin, str(wdir), 1, 7, "2026-06-01T00:00:00Z", "org/m", "a" * 40, common.file_stats(str(wdir), [shard.name]))))
    os.chown(shard, 1000, 1000)
    shard.chmod(0o640)
    rc = check.main(["--dir", str(wdir), "--manifest", str(tmp_path / "m"), "--marker", str(tmp_path / "k"),
                     "--sha256", pin, "--repo", "org/m", "--revision", "a" * 40, "--user", "65534:65534"])
    lines = capsys.readouterr().err.splitlines()
    assert rc == 1 and len(lines) == 1, lines  # the copy is what was verified: one refusal, this one
    line = lines[0]
    assert "model-00001-of-00001.safetensors is not readable by uid 65534" in line, line
    findings = diagnose.diagnose_findings({"engine": line}, RULES)
    assert [f["id"] for f in findings] == ["weights_unreadable"]
    assert "playbooks/weights.yml" in BY_ID["weights_unreadable"]["fix"]


def test_release_start_refusal(tmp_path, capsys):
    """The refusals check_release.py itself prints at a start (a real bundle and trust file: the
    key revoked on the node, another release's bundle, another manifest) lead to
    release_refused_at_start, whose fix names the playbook for each."""
    import hashlib
    import json

    from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs
    from helpers import openssl_ec_keys
    check = load_source("mm3_check_release", os.path.join(ROOT, "roles", "model_server", "files", "check_release.py"))
    keys = openssl_ec_keys(str(tmp_path), names=("site",))
    manifest = b"%s  config.json\n" % (b"1" * 64)
    document = rs.statement("m", [("config.json", "1" * 64)],
                            release={"manifest_sha256": hashlib.sha256(manifest).hexdigest()})
    bundle = json.dumps(rs.sign(document, keys["site"][0]))
    digest = rs.release_digest(rs.payload_bytes(document))
    listed = [{"name": "site", "public_key": keys["site"][1]}]
    (tmp_path / "m").write_bytes(manifest)
    (tmp_path / "b").write_text(bundle)
    for revoked, unit_digest, on_disk in ((["site"], digest, manifest), ([], "f" * 64, manifest),
                                          ([], digest, manifest + b"%s  extra.json\n" % (b"2" * 64))):
        (tmp_path / "t").write_text(json.dumps(rs.trust_document(listed, revoked)))
        (tmp_path / "m").write_bytes(on_disk)
        rc = check.main(["--bundle", str(tmp_path / "b"), "--trust", str(tmp_path / "t"), "--digest", unit_digest,
                         "--manifest", str(tmp_path / "m")])
        lines = capsys.readouterr().err.splitlines()
        assert rc == 1 and len(lines) == 1, lines
        findings = diagnose.diagnose_findings({"engine": lines[0]}, RULES)
        assert [f["id"] for f in findings] == ["release_refused_at_start"], (lines, findings)
    # What the unit runs (ExecStart as systemd holds it): not the signed release, or unreadable.
    (tmp_path / "t").write_text(json.dumps(rs.trust_document(listed, [])))
    (tmp_path / "m").write_bytes(manifest)
    for reading in (lambda unit: ["/usr/bin/docker", "run", "--rm", "other/image", "serve"],
                    lambda unit: (_ for _ in ()).throw(ValueError("busctl could not read it"))):
        check.read_exec_start = reading
        rc = check.main(["--bundle", str(tmp_path / "b"), "--trust", str(tmp_path / "t"), "--digest", digest,
                         "--manifest", str(tmp_path / "m"), "--unit", "minimax-m3.service"])
        lines = capsys.readouterr().err.splitlines()
        assert rc == 1 and len(lines) == 1, lines
        findings = diagnose.diagnose_findings({"engine": lines[0]}, RULES)
        assert [f["id"] for f in findings] == ["release_refused_at_start"], (lines, findings)
    assert "playbooks/release-trust.yml" in BY_ID["release_refused_at_start"]["fix"]
    assert "drop-in" in BY_ID["release_refused_at_start"]["fix"]


def facts(**over):
    base = {"unit_name": "minimax-m3",
            "unit": {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
                     "NRestarts": "0", "ExecMainStatus": "0"},
            "marker_path": "/data/m/r.verified.json", "marker_exists": True,
            "manifest_path": "/data/m/r.manifest.sha256", "manifest_exists": True,
            "health": {"url": "http://127.0.0.1:30000/health", "status": 200},
            "disk": {"path": "/data/models", "avail_bytes": 2000e9, "need_bytes": 888e9},
            "fabricmanager": "active", "gateway": "active", "gpus": {"seen": 8, "expected": 8}}
    base.update(over)
    return base


def state_findings(**over):
    return [f["id"] for f in diagnose.diagnose_findings(
        {"state": "\n".join(diagnose.diagnose_state_lines(facts(**over)))}, RULES)]


def test_state_rules():
    assert state_findings() == []
    assert state_findings(marker_exists=False) == ["weights_marker_missing"]
    assert state_findings(health={"url": "u", "status": -1, "msg": "Connection refused"}) == ["health_fails"]
    assert state_findings(health={"url": "u", "status": 503}) == ["health_fails"]
    assert state_findings(disk={"path": "/d", "avail_bytes": 100e9, "need_bytes": 888e9}) == ["disk_full"]
    assert state_findings(fabricmanager="failed") == ["fabric_manager"]
    assert state_findings(fabricmanager="absent") == []
    assert state_findings(gateway="inactive") == ["gateway_down"]
    assert state_findings(gpus={"seen": 7, "expected": 8}) == ["nccl_timeout"]
    assert state_findings(burnin={"status": "pass", "finished": "2026-12-05T12:00:00Z", "summary": "ok"}) == []


def test_a_failed_burn_in_is_named_with_its_numbers():
    """gpu_burnin's record (burnin.json) as the role reads it: the state line carries the measured
    number and the threshold, and leads to the rule that says why model_server refuses the node."""
    record = {"status": "fail", "finished": "2026-12-05T12:00:00Z", "problems": [
        "all-reduce bus bandwidth 320.57 GB/s at 8589934592 bytes across 8 GPUs is below the 340 GB/s threshold"]}
    ev = diagnose.diagnose_evidence({"burnin": record})
    assert ("burn-in failed 2026-12-05T12:00:00Z: all-reduce bus bandwidth 320.57 GB/s at 8589934592 bytes "
            "across 8 GPUs is below the 340 GB/s threshold") in ev["state"]
    assert [f["id"] for f in diagnose.diagnose_findings(ev, RULES)] == ["burnin_failed"]
    assert diagnose.diagnose_evidence({"burnin": {}})["state"] == diagnose.diagnose_evidence({})["state"]


def test_root_causes_rank_above_symptoms():
    order = state_findings(marker_exists=False, health={"url": "u", "status": -1, "msg": "refused"},
                           gateway="failed")
    assert order == ["weights_marker_missing", "gateway_down", "health_fails"]


def test_verify_report_lines():
    raw = {"verify_report": {"results": [
        {"name": "reasoning", "status": "failed", "detail": "reasoning_content empty; <think> in content"},
        {"name": "chat", "status": "passed", "detail": "ok"}]}}
    ev = diagnose.diagnose_evidence(raw)
    assert [f["id"] for f in diagnose.diagnose_findings(ev, RULES)] == ["raw_parser_tokens"]


SYSTEMCTL_SHOW = """Id=nvidia-fabricmanager.service
LoadState=not-found
ActiveState=inactive

Id=haproxy.service
LoadState=loaded
ActiveState=failed
"""


def test_evidence_from_what_the_tasks_read():
    raw = {"unit_name": "minimax-m3",
           "unit_show": "LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nResult=exit-code\n"
                        "NRestarts=3\nExecMainStatus=2\n",
           "units_show": SYSTEMCTL_SHOW, "gateway": True,
           "logs": {"engine": "vllm: error: unrecognized arguments: --bogus", "kernel": "", "gateway": ""},
           "marker": {"path": "/m", "exists": "True"}, "manifest": {"path": "/f", "exists": True},
           "weights_root": "/data/models", "weights_size_gb": "444",
           "df": {"rc": "0", "stdout": "   Avail\n900000000000\n"},
           "gpus": None, "health": {"url": "http://127.0.0.1:30000/health", "status": "-1", "msg": "refused"}}
    ev = diagnose.diagnose_evidence(raw)
    assert "unit minimax-m3: active=activating sub=auto-restart result=exit-code restarts=3 exit=2" in ev["state"]
    assert "disk /data/models: free 900.0 GB, two revisions need 888.0 GB: ok" in ev["state"]
    assert "fabric manager" not in ev["state"]  # not installed: not a finding
    ids = [f["id"] for f in diagnose.diagnose_findings(ev, RULES)]
    assert ids == ["bad_flag", "gateway_down", "health_fails"]


SECRETS = ["k" * 40, "sync-password-1234", "hf_" + "A" * 34]


def test_redaction():
    text = ("key %s pw=%s token %s Authorization: Bearer abcdefghijkl hf_%s\n"
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----\nshort abc"
            % (SECRETS[0], SECRETS[1], SECRETS[2], "Z" * 36))
    out = diagnose.diagnose_redact(text, SECRETS + ["abc", "", None])
    for secret in SECRETS + ["abcdefghijkl", "Z" * 36, "MIIEvQIBADANBg"]:
        assert secret not in out
    assert out.endswith("short abc")  # values under 8 characters are not secrets


# A known secret with the characters URL-encoding changes.
ODD = "p@ss/w0rd+key=1 x"


@pytest.mark.parametrize("form,text", [
    ("URL-encoded", "GET /v1/models?key=%s HTTP/1.1" % urllib.parse.quote(ODD, safe="")),
    ("form-encoded", "body: password=%s&x=1" % urllib.parse.quote_plus(ODD)),
    ("base64 alone", "config: %s" % base64.b64encode(ODD.encode()).decode()),
    ("base64 in a Basic header", "Authorization: Basic %s" % base64.b64encode(b"lab:" + ODD.encode()).decode()),
    ("base64 url-safe, 2 bytes in", "blob %s" % base64.urlsafe_b64encode(b"ab" + ODD.encode() + b"tail").decode()),
    ("wrapped at 80 columns", "x" * 70 + ODD[:10] + "\n" + ODD[10:] + " rest"),
    ("folded header", "X-Token: " + ODD[:5] + "\r\n\t" + ODD[5:]),
])
def test_a_known_secret_is_redacted_in_the_forms_a_log_carries_it(form, text):
    out = diagnose.diagnose_redact(text, [ODD])
    assert "<redacted>" in out, out
    rest = out.replace("\r", "").replace("\n", "").replace("\t", "")
    for leak in (ODD, urllib.parse.quote(ODD, safe=""), urllib.parse.quote_plus(ODD), ODD[3:12]):
        assert leak not in rest, out
    assert base64.b64encode(ODD.encode()).decode()[4:12] not in out


@pytest.mark.parametrize("line,kept", [
    # SGLang logs its ServerArgs dataclass repr at start, api_key included (as its CI logs show it:
    # "INFO engine.py:177: server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B-Instruct', ...")
    ("server_args=ServerArgs(model_path='/models/m', api_key='unknownsecret42', port=30000)", "port=30000"),
    ('{"api_key": "unknownsecret42", "port": 30000}', '"port": 30000'),
    ("launch --api-key unknownsecret42 --port 30000", "--port 30000"),
    ("launch --api-key=unknownsecret42 --port 30000", "--port 30000"),
    ("api_key=unknownsecret42 port=30000", "port=30000"),
    ("Authorization: Bearer unknownsecret42", "Authorization: Bearer"),
    ("x-api-key: unknownsecret42", "x-api-key:"),
    ("GET /health?key=unknownsecret42&x=1", "&x=1"),
    ("GET /v1/models?a=1&api_key=unknownsecret42", "?a=1"),
])
def test_an_unknown_secret_is_redacted_by_its_shape(line, kept):
    out = diagnose.diagnose_redact(line, [])
    assert "unknownsecret42" not in out and "<redacted>" in out and kept in out, out


def test_findings_redact_their_evidence():
    line = "vllm: error: unrecognized arguments: --api-key %s" % SECRETS[0]
    found = diagnose.diagnose_findings({"engine": line}, RULES, SECRETS)
    assert found[0]["id"] == "bad_flag" and SECRETS[0] not in str(found)


@pytest.mark.parametrize("broken, problem", [
    ({"rank": 0}, "rank 0"), ({"table": "other"}, "table 'other'"), ({"sources": ["disk"]}, "sources"),
    ({"match": ["("]}, "does not compile"), ({"match": []}, "match is not"), ({"fix": " "}, "fix is empty"),
])
def test_broken_rules_are_refused(broken, problem):
    rules = [dict(RULES[0], **broken)] + RULES[1:]
    problems = diagnose.diagnose_rules_problems(rules)
    assert any(problem in p for p in problems), problems
    with pytest.raises(AnsibleFilterError):
        diagnose.diagnose_findings({}, rules)


def test_a_rule_id_used_twice_is_refused():
    assert any("used twice" in p for p in diagnose.diagnose_rules_problems(RULES + [RULES[0]]))


def test_text_report():
    report = {"host": "n1", "collected_at": "t", "state": ["weights marker missing: /m"],
              "findings": diagnose.diagnose_findings({"state": "weights marker missing: /m"}, RULES)}
    text = diagnose.diagnose_text(report)
    assert "1. [weights_marker_missing]" in text and "fix:   Run playbooks/weights.yml" in text


def test_argument_specs_cover_the_defaults():
    with open(os.path.join(ROOT, "roles", "diagnose", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    with open(os.path.join(ROOT, "roles", "diagnose", "meta", "argument_specs.yml")) as handle:
        options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    for name, value in defaults.items():
        assert name.startswith("diagnose_"), name
        if not (isinstance(value, str) and "{{" in value):
            assert options[name].get("default") == value, name


def test_a_mended_episode_is_history():
    # A failure loop (the recorded docker_run_error journal: an automatic restart inside it),
    # then a start by hand that served (the recorded healthy journal): only the second counts.
    # systemd logs "Scheduled restart job" when RestartSec= is over and it restarts; a start by
    # hand while it waits follows "Failed with result" directly.
    _h, failing = fixture("docker_run_error.log")
    _h, healthy = fixture("healthy-vllm-cpu.log")
    assert "Scheduled restart job" in failing
    failing = failing[:failing.index("\n", failing.index("Failed with result"))]
    episode = diagnose.diagnose_episode(failing + "\n" + healthy, "minimax-m3")
    # the recorded healthy journal holds serve.yml's first start and its handler's restart
    assert healthy.endswith(episode) and episode.startswith("Starting minimax-m3.service")
    assert "invalid reference format" not in episode
    raw = {"unit_name": "minimax-m3", "logs": {"engine": failing + "\n" + healthy}}
    assert diagnose.diagnose_findings(diagnose.diagnose_evidence(raw), RULES) == []
    # without the start by hand, the failure is the episode
    raw = {"unit_name": "minimax-m3", "logs": {"engine": failing}}
    assert [f["id"] for f in diagnose.diagnose_findings(diagnose.diagnose_evidence(raw), RULES)] == ["docker_run_error"]


def test_automatic_restarts_stay_in_the_episode():
    # The failing loop alone: every attempt after "Scheduled restart job" is the same episode,
    # so the first attempt's error is still read while the next attempt is starting.
    _h, failing = fixture("docker_run_error.log")
    restarted = failing + "\nStarting minimax-m3.service - MiniMax-M3 model server (vllm, profile cpu-lab)..."
    assert diagnose.diagnose_episode(restarted, "minimax-m3").startswith("Starting minimax-m3.service")
    assert "docker: invalid reference format." in diagnose.diagnose_episode(restarted, "minimax-m3")
    ids = [f["id"] for f in diagnose.diagnose_findings(
        diagnose.diagnose_evidence({"unit_name": "minimax-m3", "logs": {"engine": restarted}}), RULES)]
    assert ids == ["docker_run_error"]


def test_evidence_from_registered_loop_results():
    results = [{"__diagnose_log": {"source": "engine"}, "stdout": "Started minimax-m3.service.",
                "stderr": "vllm: error: unrecognized arguments: --x"},
               {"__diagnose_log": {"source": "gateway"}, "stdout": "", "stderr": ""}]
    ev = diagnose.diagnose_evidence({"unit_name": "minimax-m3", "logs": results})
    assert ev["engine"].splitlines() == ["Started minimax-m3.service.", "vllm: error: unrecognized arguments: --x"]
    assert [f["id"] for f in diagnose.diagnose_findings(ev, RULES)] == ["bad_flag"]


def test_the_engine_usage_text_is_not_a_media_refusal():
    # vLLM's usage lines name --allowed-media-domains (recorded in the lab's wrong-flag drill)
    usage = "                  [--allowed-media-domains ALLOWED_MEDIA_DOMAINS [ALLOWED_MEDIA_DOMAINS ...]]"
    assert diagnose.diagnose_findings({"engine": usage, "gateway": ""}, RULES) == []


# The Fabric block of `nvidia-smi -q` per GPU, in the text form of the fields NVIDIA's own
# captures hold (NVIDIA/k8s-test-infra tests/e2e/go/assertions/nvidiasmi/testdata/hardware/
# qx-h100.xml: <fabric><state>, <status>, <cliqueId>, <clusterUuid>), with the state the fabric
# manager leaves while it trains the NVSwitch fabric (preflight reads the same block).
FABRIC_Q = """GPU 00000000:%02X:00.0
    Product Name                          : NVIDIA H200
    Fabric
        State                             : %s
        Status                            : %s
        CliqueId                          : N/A
        ClusterUUID                       : N/A
"""


def test_the_gpus_fabric_state_from_nvidia_smi_q():
    hardware = load_source("mm3_hardware_filters_diag", os.path.join(ROOT, "filter_plugins", "hardware.py"))
    training = "".join(FABRIC_Q % (i, "In Progress", "N/A") for i in range(8))
    trained = "".join(FABRIC_Q % (i, "Completed", "Success") for i in range(8))
    assert state_findings(gpu_fabric=hardware.fabric_states(training)) == ["fabric_not_ready"]
    assert "gpu fabric: In Progress on 8 of 8 GPUs (need Completed)" in diagnose.diagnose_state_lines(
        facts(gpu_fabric=hardware.fabric_states(training)))
    assert state_findings(gpu_fabric=hardware.fabric_states(trained)) == []
    assert state_findings(gpu_fabric=[]) == []   # a PCIe node prints no Fabric block


def test_a_burst_of_routine_traffic_hides_no_gateway_refusal_or_failure():
    """The gateway's journal is read as its last messages, refusals and failures: routine requests
    (status 1xx-3xx, no refusal) are left out before the window is cut. Read as the last 400 lines,
    the lab's access-log burst (400 x GET /health 200) pushed the verification's media refusal out
    and the drill's diagnosis found nothing. Recorded: the real HAProxy's journal on the lab."""
    _header, recorded_journal = fixture("healthy-gateway-lab.log")
    lines = recorded_journal.splitlines()
    routine = [line for line in lines if "path=/health status=200 " in line]
    other = [line for line in lines if diagnose.ROUTINE_ACCESS.match(line) is None]
    assert len(routine) > 300 and any(line.startswith("[ALERT]") for line in other)
    # the outage and its 503s, then a second burst of routine traffic twice the window's size
    journal = "\n".join(lines + routine * 3)
    raw = {"unit_name": "minimax-m3", "log_lines": 400,
           "logs": [{"__diagnose_log": {"source": "gateway"}, "stdout": journal, "stderr": ""}]}
    kept = diagnose.diagnose_evidence(raw)["gateway"].splitlines()
    assert kept == other[-400:]
    assert any("status=503" in line for line in kept) and not any(diagnose.ROUTINE_ACCESS.match(x) for x in kept)


def test_the_window_of_gateway_lines_is_the_last_n():
    text = "\n".join("mm3-gateway client=a src=1.2.3.4 method=POST path=/v1/chat/completions status=429 bytes=1 "
                     "ttfb_ms=-1 total_ms=0 refusal=rate-%d" % i for i in range(10))
    assert diagnose.diagnose_gateway_lines(text, 3).splitlines()[0].endswith("refusal=rate-7")
    assert len(diagnose.diagnose_gateway_lines(text, None).splitlines()) == 10
