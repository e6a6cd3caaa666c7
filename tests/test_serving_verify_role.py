"""roles/serving_verify through playbooks/verify.yml (ansible-runner, localhost as the serving
node, the serving role resolving the cpu-lab profile for real), against real loopback servers:

- the SGLang protocol STAND-IN of tests/unit/test_serving_verify_protocol.py (a small HTTP
  server answering with SGLang's documented response shapes, not an engine; its header says
  what it reproduces), here listening on IPv6 loopback;
- the gateway's real HAProxy rendered from the role's own templates in front of the recording
  upstream (tests/gateway_harness.py, the same harness as tests/test_gateway_haproxy.py).

What the role decides, and what would break without it: the engine URL for an IPv6 bind has
brackets (serving_engine_url); a gateway client without requests_per_minute is tested at the
gateway's default 600 (gateway_client), not skipped; with no list given the module runs its own
default list (the role passes none); bad client names and a missing evaluation set are refused
before any request. What the module was given is read from its report (the checks run, the CA,
the limits the gateway checks were held to; never a key).
"""
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest
import yaml

import gateway_harness as gh
from helpers import ROOT, failures, load_source, openssl_ec_keys, run_playbook

from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils import serving_verify_checks as checks  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "unit"))
import test_serving_verify_protocol as proto  # noqa: E402  (the SGLang protocol stand-in)

ENGINE_KEY = "Xr4Tq8Lm2Wv6Zp0Ks3Nd7Hb5Jc9Gf1Ay"  # >= 32 characters: the serving role's rule
STANDIN_MODEL = "MiniMaxAI/MiniMax-M3-MXFP8"          # what the stand-in lists at /v1/models
MAIN_KEY = "mK3vQ9zL2xR7tB5nW8cJ4hF6dS1aG0pE"
LIMITS_KEY = "Lq7Wc2Zr9Tn4Vb6Xm1Ks8Jd3Hf5Gp0Ay"
# The limits client leaves every limit out: the gateway holds it to its defaults (600/min).
CLIENTS = [{"name": "verify", "key": MAIN_KEY}, {"name": "verify-limits", "key": LIMITS_KEY}]
EVAL_SET = {"version": 1, "name": "role-test", "pass_threshold": 1.0,
            "cases": [{"name": "sum", "prompt": "What is 17 + 25?", "expect": {"contains": ["42"]}}]}
REFUSAL_TASK = "Refuse gateway client names and an evaluation set that cannot work"


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@pytest.fixture
def standin_v6(monkeypatch):
    """The protocol stand-in on [::1], requiring ENGINE_KEY (the serving role refuses a short key)."""
    monkeypatch.setattr(proto, "KEY", ENGINE_KEY)
    state = proto.StandIn()
    server = _V6Server(("::1", 0), proto._handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.port = server.server_address[1]
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def site_ca(tmp_path_factory):
    out = tmp_path_factory.mktemp("ca")
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "files", "make_site_ca.py"), str(out),
                    "127.0.0.1", "localhost"], check=True, capture_output=True)
    return str(out)


def node_vars(port, **extra):
    """Inventory of one serving node (localhost) resolving cpu-lab with the serving role."""
    values = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
              "serving_profile": "cpu-lab", "serving_engine": "vllm", "serving_port": port,
              "serving_allow_unpinned_image": True,
              "serving_image": {"repository": "mm3-lab/vllm-cpu", "tag": "lab"},
              "serving_weights_revision": "0" * 40,
              "serving_verify_timeouts": {"health": 10, "interval": 0.5, "request": 10}}
    values.update(extra)
    return values


def verify(tmp_path, values, extravars=None):
    """playbooks/verify.yml with one node. Returns (runner, text, the node's report or None)."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"children": {"nodes": {"hosts": {"node1": values}}}}}))
    reports = tmp_path / "reports"
    runner, text = run_playbook("playbooks/verify.yml", tmp_path, inventory=str(inv),
                                extravars=dict({"serving_verify_report_dir": str(reports)}, **(extravars or {})))
    report = reports / "node1.json"
    return runner, text, json.loads(report.read_text()) if report.exists() else None


def test_an_ipv6_bind_is_verified_at_a_bracketed_url(tmp_path, standin_v6):
    """serving_engine_url: http://[::1]:PORT. The old recomputation gave http://::1:PORT, which
    is not a URL (RFC 3986 brackets an IPv6 literal): Python's client happens to split it at the
    last colon, curl and the readers of the report do not."""
    runner, text, report = verify(tmp_path, node_vars(
        standin_v6.port, serving_bind_address="::1", serving_api_key=ENGINE_KEY,
        serving_verify_checks=["health", "models", "auth"], serving_verify_expected_model=STANDIN_MODEL))
    assert runner.rc == 0, text[-3000:]
    assert report["base_url"] == "http://[::1]:%d" % standin_v6.port
    assert [(r["name"], r["status"]) for r in report["results"]] == [
        ("health", "passed"), ("models", "passed"), ("auth", "passed")]
    assert report["checks"] == ["health", "models", "auth"]
    assert ENGINE_KEY not in text


def test_without_a_list_the_module_runs_its_own_default_with_the_evaluation_set(tmp_path, standin_v6):
    """No serving_verify_checks: the module runs default_checks() - every functional check, then
    eval with the role's set (tests/unit/test_serving_verify.py shows no copy of the list
    outside mm3.shared)."""
    eval_file = tmp_path / "set.yml"
    eval_file.write_text(yaml.safe_dump(EVAL_SET))
    runner, text, report = verify(tmp_path, node_vars(
        standin_v6.port, serving_bind_address="::1", serving_api_key=ENGINE_KEY,
        serving_verify_expected_model=STANDIN_MODEL, serving_verify_eval_set_file=str(eval_file)))
    assert runner.rc == 0, text[-3000:]
    assert report["checks"] == checks.default_checks(EVAL_SET) == checks.FUNCTIONAL_CHECKS + ["eval"]
    by_name = {r["name"]: r["status"] for r in report["results"]}
    assert by_name.pop("image") == "skipped"  # outside cpu-lab's capability boundary
    assert set(by_name.values()) == {"passed"}, report["results"]
    evaluation = {r["name"]: r for r in report["results"]}["eval"]
    assert evaluation["data"]["set"] == "role-test", evaluation


def test_a_client_without_a_rate_is_checked_at_the_gateway_default_600(tmp_path, site_ca):
    """Behind the real HAProxy: the verification goes to the gateway's endpoint (its port and
    site CA from the gateway role) as `verify`; `verify-limits` lists no requests_per_minute, so
    the gateway holds it to 600 a minute and gateway_rate must see request 601 refused."""
    with gh.RecordingUpstream() as upstream:
        spec = gh.lab_spec(site_ca, upstream.port, CLIENTS)
        with gh.running_gateway(tmp_path / "gw", spec, site_ca) as url:
            runner, text, report = verify(
                tmp_path, node_vars(upstream.port, serving_gateway=True, serving_bind_address="127.0.0.1",
                                    gateway_port=spec["port"], gateway_clients=CLIENTS,
                                    serving_verify_gateway_client="verify",
                                    serving_verify_gateway_limits_client="verify-limits",
                                    serving_verify_expected_model="tiny-m3",
                                    serving_verify_checks=["models", "auth", "gateway_rate"]),
                # The harness's configuration directory stands in for /etc/haproxy/mm3.
                extravars={"__gateway_config_dir": url.config_dir})
    assert runner.rc == 0, text[-3000:]
    assert report["base_url"] == "https://127.0.0.1:%d" % spec["port"]
    assert report["ca_path"] == os.path.join(url.config_dir, "ca.pem")
    assert report["gateway"]["rate_per_minute"] == 600
    assert report["gateway"]["max_body_bytes"] == 2 * 1024 * 1024 and report["gateway"]["max_tokens"] == 8192
    rate = {r["name"]: r for r in report["results"]}["gateway_rate"]
    assert rate["status"] == "passed" and rate["data"]["requests"] == 601, rate
    assert MAIN_KEY not in text and LIMITS_KEY not in text
    # the engine never saw a client's key
    assert all("authorization" not in {h.lower() for h in r["headers"]} for r in upstream.requests)


@pytest.mark.parametrize("extra,needles", [
    ({"serving_verify_gateway_client": "ghost", "serving_verify_gateway_limits_client": "nobody",
      "serving_verify_eval_set_file": "/nonexistent/set.yml", "serving_verify_checks": ["models", "eval"]},
     ["serving_verify_gateway_client 'ghost' names no client of gateway_clients (verify, verify-limits)",
      "serving_verify_gateway_limits_client 'nobody' names no client",
      "serving_verify_eval_set_file /nonexistent/set.yml is not a file on the controller"]),
    ({"serving_verify_gateway_limits_client": "verify"},
     ["serving_verify_gateway_limits_client 'verify' is also the client the checks act as"]),
], ids=["unknown-names-and-missing-set", "one-client-for-both"])
def test_bad_client_names_and_a_missing_set_are_refused_before_any_request(tmp_path, extra, needles):
    values = node_vars(9, serving_gateway=True, serving_bind_address="127.0.0.1",
                       gateway_clients=CLIENTS, **extra)
    runner, text, report = verify(tmp_path, values)
    assert runner.rc != 0
    msg = failures(runner).get(REFUSAL_TASK)
    assert msg, (failures(runner), text[-2000:])
    for needle in needles:
        assert needle in msg, msg
    assert report is None or not report.get("results")  # no check ran
    assert MAIN_KEY not in text and LIMITS_KEY not in text


def test_a_signed_release_is_judged_only_by_the_evaluation_set_it_names(tmp_path):
    """Issue 33: the release names its evaluation set (release-part.json's eval_set, as the plan
    writes it: serving_release_part of the resolved spec with role serving_verify's
    release_eval_set). With that release deployed, another set - here the same set with a lower
    threshold - is refused before any request; the signed set passes the refusal."""
    serving = load_source("mm3_serving_filters_vr", os.path.join(ROOT, "filter_plugins", "serving.py"))
    release = load_source("mm3_release_filters_vr", os.path.join(ROOT, "filter_plugins", "release.py"))
    signed_set, weaker = tmp_path / "signed.yml", tmp_path / "weaker.yml"
    signed_set.write_text(yaml.safe_dump(EVAL_SET))
    weaker.write_text(yaml.safe_dump(dict(EVAL_SET, pass_threshold=0.1)))
    values = node_vars(9, serving_weights_manifest_sha256="c" * 64, serving_verify_checks=["eval"],
                       serving_verify_eval_set_file=str(signed_set))
    # What this node runs, resolved by the serving role as on the node; the part the plan writes of it
    spec_out = tmp_path / "spec.json"
    runner, text = run_playbook("tests/playbooks/serving-resolve.yml", tmp_path / "resolve",
                                extravars=dict(values, spec_out=str(spec_out)))
    assert runner.rc == 0, text[-2000:]
    part = serving.release_part(json.loads(spec_out.read_text()), release.release_eval_set(EVAL_SET))
    key = openssl_ec_keys(str(tmp_path))["site"]
    bundle = json.dumps(rs.sign(rs.statement("tiny", [("config.json", "1" * 64)], release=part), key[0]))
    values.update(serving_release_keys=[{"name": "site-2026", "public_key": key[1]}],
                  serving_release_bundle=bundle)

    for sub in ("weaker", "signed"):
        (tmp_path / sub).mkdir()
    runner, text, _report = verify(tmp_path / "weaker", dict(values, serving_verify_eval_set_file=str(weaker)))
    msg = failures(runner).get(REFUSAL_TASK)
    assert runner.rc != 0 and msg, (failures(runner), text[-2000:])
    assert "the evaluation set %s (role-test, sha256 " % weaker in msg, msg
    assert "is not the one the signed release" in msg and "(key 'site-2026') names (role-test, sha256 " in msg, msg
    assert "Run the serving_verify checks" not in text  # nothing was asked of the engine

    runner, text, _report = verify(tmp_path / "signed", values)
    assert REFUSAL_TASK not in failures(runner), failures(runner)
    assert "Run the serving_verify checks" in text  # the signed set runs (against no engine here)
