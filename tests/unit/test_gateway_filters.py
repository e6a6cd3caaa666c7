"""filter_plugins/gateway.py: every refusal the issue names is a blocker that names its fix,
and nothing of a client key but its SHA-256 reaches gateway_spec."""
import datetime
import json
import os
import subprocess

import pytest

import gateway_harness
from helpers import ROOT, load_source, serving_args

gateway = load_source("mm3_gateway_filters", os.path.join(ROOT, "filter_plugins", "gateway.py"))
KEY_A = "mK3vQ9zL2xR7tB5nW8cJ4hF6dS1aG0pE"
KEY_B = "Lq7Wc2Zr9Tn4Vb6Xm1Ks8Jd3Hf5Gp0Ay"


@pytest.fixture(scope="module")
def pems(tmp_path_factory):
    out = {}
    for kind, extra in (("good", []), ("expired", ["--expired"]), ("other", [])):
        path = tmp_path_factory.mktemp(kind)
        subprocess.run(["python3", os.path.join(ROOT, "lab", "files", "make_site_ca.py"), str(path),
                        "gw.example"] + extra, check=True, capture_output=True)
        out[kind] = {name: (path / name).read_text() for name in ("gateway.pem", "gateway.key", "ca.pem")}
    return out


def resolve(pems, clients=None, **kwargs):
    options = dict(allowed_networks=["10.20.0.0/16"], tls_cert_pem=pems["good"]["gateway.pem"],
                   tls_key_pem=pems["good"]["gateway.key"],
                   upstreams=[{"name": "engine", "address": "127.0.0.1", "port": 30000}])
    options.update(kwargs)
    return gateway.gateway_resolve(clients if clients is not None else [{"name": "app", "key": KEY_A}], **options)


def test_a_good_gateway_has_no_blockers_and_no_key_in_clear(pems):
    spec = resolve(pems, [{"name": "app", "key": KEY_A}, {"name": "batch", "key": KEY_B, "max_tokens": 512}])
    assert spec["blockers"] == []
    text = json.dumps(spec)
    assert KEY_A not in text and KEY_B not in text
    assert spec["clients"][0]["key_sha256"] == gateway.key_digest(KEY_A)
    assert spec["clients"][1]["max_tokens"] == 512 and spec["clients"][0]["max_tokens"] == 8192
    assert gateway.gateway_keys_map(spec).splitlines()[1] == gateway.key_digest(KEY_B) + " batch"
    # The buffer holds the largest body a client may send, plus headers.
    assert spec["bufsize"] >= 2 * 1024 * 1024 + 65536 and spec["bufsize"] % 16384 == 0


@pytest.mark.parametrize("clients,needle", [
    ([], "gateway_clients is empty"),
    ([{"name": "app", "key": "short-key-1234567"}], "has 17 characters (at least 32)"),
    ([{"name": "app", "key": "x" * 40}], "looks like a placeholder"),
    ([{"name": "app", "key": "changeme-" + KEY_A}], "looks like a placeholder"),
    ([{"name": "app", "key": KEY_A[:16] + " " + KEY_A[16:]}], "whitespace or a control character"),
    ([{"name": "app", "key": KEY_A}, {"name": "other", "key": KEY_A}], "have the same key"),
    ([{"name": "app", "key": KEY_A}, {"name": "app", "key": KEY_B}], "appears twice"),
    ([{"name": "App Server", "key": KEY_A}], "is not a plain name"),
    ([{"name": "app\n", "key": KEY_A}], "is not a plain name"),  # re's $ matched before a final newline
    ([{"name": "app", "key": KEY_A, "requests_per_minute": 0}], "requests_per_minute is 0"),
    ([{"name": "app", "key": KEY_A, "max_body_bytes": True}], "max_body_bytes is True"),
    ([{"name": "app", "key": KEY_A, "rate": 5}], "unknown settings rate"),
    ([{"name": "app"}], "has no key"),
])
def test_client_refusals(pems, clients, needle):
    spec = resolve(pems, clients)
    assert any(needle in b for b in spec["blockers"]), spec["blockers"]
    assert KEY_A not in json.dumps(spec["blockers"])


@pytest.mark.parametrize("kwargs,needle", [
    ({"allowed_networks": []}, "gateway_allowed_networks is empty"),
    ({"allowed_networks": ["10.0.0.0/33"]}, "is not a network"),
    ({"metrics_networks": ["monitoring"]}, "gateway_metrics_networks entry 'monitoring'"),
    ({"media_allowlist": ["https://images.intranet/"]}, "is not a host name"),
    ({"media_allowlist": ["*.intranet"]}, "is not a host name"),
    ({"media_allowlist": ["10.1.2.3"]}, "is not a host name"),
    ({"port": 70000}, "gateway_port is 70000"),
    ({"bind_address": "gateway.local"}, "gateway_bind_address 'gateway.local' is not an IP"),
    ({"engine_bind_address": "0.0.0.0"}, "serving_bind_address is 0.0.0.0 while a gateway"),
    ({"upstreams": [{"name": "n1", "address": "10.0.0.5", "port": 30000}]}, "neither loopback nor TLS"),
    ({"upstreams": []}, "has no upstream"),
    ({"upstream_timeout_s": 1}, "gateway_upstream_timeout_s is 1"),
    ({"max_connections": 10}, "gateway_max_connections is 10: set a number of connections between 64"),
    ({"max_connections": "lots"}, "gateway_max_connections is 'lots'"),
    ({"max_connections_per_source": 0}, "gateway_max_connections_per_source is 0"),
    ({"log_queue": 10}, "gateway_log_queue is 10: set a number of datagrams between 64 and 65536"),
    ({"log_rate_limit_burst": 0}, "gateway_log_rate_limit_burst is 0: set the log lines per second"),
    ({"log_rate_limit_burst": "1e6"}, "gateway_log_rate_limit_burst is '1e6'"),
    ({"max_connections": 100, "max_connections_per_source": 101},
     "gateway_max_connections_per_source is 101: set a number between 1 and gateway_max_connections (100)"),
    ({"tls_cert_pem": None}, "is not set"),
    ({"tls_cert_pem": "not a pem"}, "is not a PEM certificate"),
])
def test_setting_refusals(pems, kwargs, needle):
    spec = resolve(pems, **kwargs)
    assert any(needle in b for b in spec["blockers"]), spec["blockers"]


def test_certificate_that_does_not_match_its_key(pems):
    spec = resolve(pems, tls_key_pem=pems["other"]["gateway.key"])
    assert any("does not belong to gateway_tls_cert_pem" in b for b in spec["blockers"]), spec["blockers"]


def test_expired_certificate(pems):
    spec = resolve(pems, tls_cert_pem=pems["expired"]["gateway.pem"], tls_key_pem=pems["expired"]["gateway.key"])
    assert any("expired on" in b and "renew" in b for b in spec["blockers"]), spec["blockers"]


def test_a_certificate_valid_today_expires_later(pems):
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=900)
    spec = resolve(pems, now=later)
    assert any("expired on" in b for b in spec["blockers"])


def test_media_allowlist_is_normalised(pems):
    spec = resolve(pems, media_allowlist=["Images.Intranet.", "images.intranet"])
    assert spec["media_allowlist"] == ["images.intranet"] and not spec["blockers"]


def test_serving_refuses_a_key_or_an_open_bind_behind_the_gateway():
    serving = load_source("mm3_serving_filters", os.path.join(ROOT, "filter_plugins", "serving.py"))
    import yaml
    with open(os.path.join(ROOT, "roles", "serving", "vars", "main.yml")) as handle:
        facts = yaml.safe_load(handle)
    base = dict(profile="cpu-lab", engine="vllm", allow_unpinned_image=True, gateway=True)
    ok = serving.serving_resolve(*serving_args(**base))
    assert ok["gateway"] is True and not any("gateway" in b for b in ok["blockers"])
    keyed = serving.serving_resolve(*serving_args(api_key=KEY_A, api_key_defined=True, **base))
    assert any("serving_api_key is set while serving_gateway is true" in b for b in keyed["blockers"])
    open_bind = serving.serving_resolve(*serving_args(bind_address="0.0.0.0", **base))
    assert any("not loopback while serving_gateway is true" in b for b in open_bind["blockers"])


def test_fleet_upstreams_from_the_inventory(pems):
    # each node's gateway_endpoint, as serve.yml publishes it on the node (its gateway_port)
    hostvars = {"GPU-Node-01": {"gateway_endpoint": {"port": 8443}},
                "n2": {"gateway_node_address": "10.0.0.2", "gateway_endpoint": {"port": 9443}}}
    ups = gateway.fleet_upstreams(["GPU-Node-01", "n2"], hostvars)
    assert ups == [{"name": "gpu-node-01", "address": "GPU-Node-01", "port": 8443, "tls": True},
                   {"name": "n2", "address": "10.0.0.2", "port": 9443, "tls": True}]
    assert resolve(pems, upstreams=ups)["blockers"] == []
    # rollout.yml and rollback.yml drain a node by this name: the one its upstream got.
    assert [gateway.pool_name(n) for n in ["GPU-Node-01", "n2"]] == [u["name"] for u in ups]
    assert gateway.pool_name("Rack 3/Node_7") == "rack-3-node_7"
    mixed = ups + [{"name": "engine", "address": "127.0.0.1", "port": 30000}]
    assert any("mixes TLS and plain" in b for b in resolve(pems, upstreams=mixed)["blockers"])
    # a node whose gateway published no endpoint (serve.yml run with --limit gateway) is refused,
    # never given a port the fleet gateway guessed
    lonely = gateway.fleet_upstreams(["n3"], {"n3": {"gateway_port": 9443}})
    assert lonely[0]["port"] is None
    assert any("from the gateway_endpoint serve.yml publishes" in b
               for b in resolve(pems, upstreams=lonely)["blockers"])


def test_vllm_gets_the_media_allowlist_as_its_own_switch_and_sglang_nothing():
    serving = load_source("mm3_serving_filters", os.path.join(ROOT, "filter_plugins", "serving.py"))
    import yaml
    with open(os.path.join(ROOT, "roles", "serving", "vars", "main.yml")) as handle:
        facts = yaml.safe_load(handle)
    base = dict(allow_unpinned_image=True, gateway=True)
    vllm = serving.serving_resolve(*serving_args(profile="h200", engine="vllm",
                                                 media_domains=["Images.Intranet", "cdn.intranet"], **base))
    assert not [b for b in vllm["blockers"] if "media" in b], vllm["blockers"]
    assert vllm["command"][-6:-4] == ["cdn.intranet", "images.intranet"] or \
        "--allowed-media-domains cdn.intranet images.intranet" in " ".join(vllm["command"])
    empty = serving.serving_resolve(*serving_args(profile="h200", engine="vllm", media_domains=[], **base))
    assert "--allowed-media-domains" not in empty["command"]
    sglang = serving.serving_resolve(*serving_args(profile="b200", engine="sglang",
                                                   media_domains=["images.intranet"], **base))
    assert "--allowed-media-domains" not in sglang["command"]
    assert not [b for b in sglang["blockers"] if "media" in b]
    bad = serving.serving_resolve(*serving_args(profile="h200", engine="vllm",
                                                media_domains=["https://x/"], **base))
    assert any("serving_media_domains entry 'https://x/' is not a host name" in b for b in bad["blockers"])


def test_a_check_acting_as_a_client_gets_its_limits_with_the_gateway_defaults():
    """gateway_client: the named client (else the first), every limit it leaves out at the
    gateway's default (a client without requests_per_minute is held to 600, so the rate check
    must test 600, not skip)."""
    clients = [{"name": "app", "key": "k1"}, {"name": "slow", "key": "k2", "requests_per_minute": 6}]
    assert gateway.gateway_client(clients, "slow")["requests_per_minute"] == 6
    assert gateway.gateway_client(clients, "app") == dict(gateway.CLIENT_DEFAULTS, name="app", key="k1")
    assert gateway.gateway_client(clients)["name"] == "app"
    assert gateway.gateway_client(clients, "nobody")["name"] == "app"
    assert gateway.gateway_client([], "app") == {}


def test_a_client_allowed_more_than_the_engine_generates_is_refused(pems):
    """The engine's own cap (serving_max_output_tokens) is the second line behind a client's
    max_tokens: a client above it would get answers cut short without a refusal (issue 32)."""
    clients = [{"name": "app", "key": KEY_A}, {"name": "batch", "key": KEY_B, "max_tokens": 4096}]
    text = "\n".join(resolve(pems, clients, engine_max_output_tokens=4096)["blockers"])
    assert ("gateway client app may ask for max_tokens 8192, above the engine's own cap of 4096 "
            "(serving_max_output_tokens): lower its max_tokens or raise serving_max_output_tokens.") in text
    assert "client batch" not in text
    # The role's defaults agree: every client default fits the engine's default cap.
    args, _ = serving_args()
    assert resolve(pems, clients, engine_max_output_tokens=args["max_output_tokens"])["blockers"] == []
    # A fleet gateway has no engine of its own.
    assert resolve(pems, clients, engine_max_output_tokens=None)["blockers"] == []


def test_limits_shared_by_the_gateway_instances_a_client_reaches(pems):
    # Three fleet gateways: each admits a third of the client's rate and requests in flight
    # (rounded down, so together never more); body and max_tokens are per request.
    clients = [{"name": "app", "key": KEY_A, "requests_per_minute": 600, "concurrent": 16, "max_tokens": 512}]
    spec = resolve(pems, clients, limit_share=3)
    assert spec["blockers"] == []
    app = spec["clients"][0]
    assert (app["requests_per_minute"], app["concurrent"], app["max_tokens"]) == (200, 5, 512)
    assert app["max_body_bytes"] == 2 * 1024 * 1024
    assert app["limits_total"] == {"requests_per_minute": 600, "concurrent": 16}
    assert spec["limit_share"] == 3
    # what the rendered gateway enforces is the divided limit
    cfg = gateway_harness.render(spec, "/etc/haproxy/mm3", "/run/haproxy")["haproxy.cfg"]
    assert "sc_http_req_rate(0) gt 200 }" in cfg and "sc_conn_cur(0) gt 5 }" in cfg
    # A check acting as that client through one of them expects the same numbers.
    one = gateway.gateway_client(clients, "app", share="3")
    assert (one["requests_per_minute"], one["concurrent"], one["key"]) == (200, 5, KEY_A)
    # One instance: unchanged.
    assert resolve(pems, clients)["clients"][0]["requests_per_minute"] == 600


@pytest.mark.parametrize("share,clients,needle", [
    (0, None, "gateway_limit_share is 0"),
    ("two", None, "gateway_limit_share is 'two'"),
    (True, None, "gateway_limit_share is True"),
    (1001, None, "gateway_limit_share is 1001"),
    (4, [{"name": "app", "key": KEY_A, "concurrent": 3}],
     "gateway client 'app' concurrent is 3, shared by 4 gateway instances"),
])
def test_a_share_that_leaves_an_instance_nothing_is_refused(pems, share, clients, needle):
    spec = resolve(pems, clients, limit_share=share)
    assert any(needle in b for b in spec["blockers"]), spec["blockers"]


@pytest.mark.parametrize("groups,host,share", [
    ({"gateway": ["gw1", "gw2", "gw3"], "nodes": ["n1", "n2"]}, "gw2", 3),  # a fleet gateway
    ({"gateway": ["gw1"], "nodes": ["n1", "n2"]}, "n1", 1),  # a node behind the fleet: second line
    ({"nodes": ["n1", "n2", "n3", "n4"]}, "n3", 4),  # no fleet: clients may reach every node
    ({"gateway": [], "nodes": ["n1"]}, "n1", 1),
    ({}, "solo", 1),
])
def test_the_default_share_follows_the_topology(groups, host, share):
    assert gateway.limit_share_default(groups, host) == share


# --- the policy a signed release binds (issue 33) -------------------------------------------------

class _SealedKey(dict):
    """A client entry whose key cannot be read: the policy must not need it (a vaulted key is
    decrypted on access)."""

    def __getitem__(self, item):
        if item == "key":
            raise AssertionError("gateway_policy read a client's key")
        return dict.__getitem__(self, item)

    def get(self, item, default=None):
        if item == "key":
            raise AssertionError("gateway_policy read a client's key")
        return dict.get(self, item, default)


def test_the_policy_is_names_limits_networks_media_and_paths_never_keys():
    clients = [_SealedKey(name="b-app", key=KEY_B, requests_per_minute=60),
               _SealedKey(name="a-app", key=KEY_A, concurrent="4")]
    policy = gateway.gateway_policy(clients, ["10.20.0.0/16", " 10.1.2.3 "], [], ["Images.Intranet."])
    assert policy == {
        "clients": [dict(gateway.CLIENT_DEFAULTS, name="a-app", concurrent=4),
                    dict(gateway.CLIENT_DEFAULTS, name="b-app", requests_per_minute=60)],
        "allowed_networks": ["10.1.2.3/32", "10.20.0.0/16"], "metrics_networks": [],
        "media_allowlist": ["images.intranet"], "client_paths": gateway.CLIENT_PATHS}
    assert json.dumps(policy) and KEY_A not in json.dumps(policy)
    # the order of the inventory's lists is not policy; a limit, a network, a host or a client is
    assert gateway.gateway_policy(list(reversed(clients)), ["10.1.2.3", "10.20.0.0/16"], [], ["images.intranet"]) == policy
    for other in (gateway.gateway_policy([dict(clients[0], requests_per_minute=61), clients[1]],
                                         ["10.20.0.0/16", "10.1.2.3"], [], ["images.intranet"]),
                  gateway.gateway_policy(clients, ["10.20.0.0/16"], [], ["images.intranet"]),
                  gateway.gateway_policy(clients, ["10.20.0.0/16", "10.1.2.3"], [], []),
                  gateway.gateway_policy(clients[:1], ["10.20.0.0/16", "10.1.2.3"], [], ["images.intranet"])):
        assert other and other != policy
    # a new key for a client is the same policy (keys rotate without a new release)
    assert gateway.gateway_policy([dict(name="b-app", key="x" * 40, requests_per_minute=60), clients[1]],
                                  ["10.20.0.0/16", "10.1.2.3"], [], ["images.intranet"]) == policy
    # what the gateway role refuses has no policy (the role names the fix)
    for bad in (dict(clients=[]), dict(clients=[{"name": "Bad Name"}]),
                dict(clients=[{"name": "a", "concurrent": 0}]), dict(clients=[{"name": "a"}, {"name": "a"}]),
                dict(clients=[{"name": "a"}], allowed_networks=["not-a-net"]),
                dict(clients=[{"name": "a"}], media_allowlist=["http://x"])):
        assert gateway.gateway_policy(**bad) is None, bad
