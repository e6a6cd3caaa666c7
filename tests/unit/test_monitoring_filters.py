"""filter_plugins/monitoring.py: every value that reaches a Prometheus, Alertmanager, blackbox
or node exporter file passes one check, and each refusal is a blocker that names its fix."""
import os

import pytest
import yaml

from helpers import ROOT, load_source

monitoring = load_source("mm3_monitoring_filters_unit", os.path.join(ROOT, "filter_plugins", "monitoring.py"))
with open(os.path.join(ROOT, "roles", "monitoring", "vars", "main.yml")) as handle:
    ROLE_VARS = yaml.safe_load(handle)
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
DIGEST = "sha256:" + "c" * 64


def serving_spec(**kwargs):
    spec = {"engine": "sglang", "profile": "b200", "gateway": True, "bind_address": "127.0.0.1",
            "port": 30000, "gpu": {"vendor": "nvidia"}, "weights": {"revision": "e" * 40},
            "image": {"digest": "sha256:" + "d" * 64}}
    spec.update(kwargs)
    return spec


# What the node's own roles published before the monitoring host reads it (playbooks/monitor.yml):
# the exporters' ports with monitoring_node's defaults, and its gateway's port.
PUBLISHED = {"monitoring_node_spec": {"exporter_port": 9100, "dcgm_port": 9400},
             "gateway_endpoint": {"port": 8443}}


def published(**node_vars):
    return dict(PUBLISHED, **node_vars)


def resolve(budget=None, alert_for=None, targets=None, **kwargs):
    targets = targets if targets is not None else [monitoring.node_target("gpu01", published(serving_spec=serving_spec()))]
    return monitoring.monitoring_resolve(
        budget=dict(ROLE_VARS["__monitoring_budget_defaults"], **(budget or {})),
        alert_for=dict(ROLE_VARS["__monitoring_alert_for_defaults"], **(alert_for or {})),
        targets=targets, gateway_ca_pem=kwargs.pop("gateway_ca_pem", CA), **kwargs)


def test_the_defaults_resolve_with_no_blocker():
    spec = resolve()
    assert spec["blockers"] == []
    assert spec["budget"]["ttft_p99_s"] == 5 and spec["alert_for"]["engine_down"] == 60
    target = spec["targets"][0]
    assert target["engine_scrape"] == {"scheme": "https", "port": 8443, "path": "/metrics"}
    assert target["release"] == "eeeeeeeeeeee@dddddddddddd" and target["gpu_exporter"] == "dcgm"


@pytest.mark.parametrize("kwargs,fix", [
    ({"budget": {"ttft_p99_s": 0}}, "monitoring_budget.ttft_p99_s is 0: set time to first token"),
    ({"budget": {"queue_max": 2.5}}, "monitoring_budget.queue_max is 2.5"),
    ({"budget": {"error_ratio": "lots"}}, "monitoring_budget.error_ratio is 'lots'"),
    ({"budget": {"kv_cache_ratio": 1.5}}, "monitoring_budget.kv_cache_ratio is 1.5"),
    ({"budget": {"ttft_p90_s": 1}}, "monitoring_budget.ttft_p90_s is not a budget"),
    ({"budget": {"cert_days": True}}, "monitoring_budget.cert_days is True"),
    ({"alert_for": {"engine_down": -1}}, "monitoring_alert_for.engine_down is -1: set whole seconds"),
    ({"alert_for": {"engine_dwon": 5}}, "monitoring_alert_for.engine_dwon names no alert"),
    ({"scrape_interval_s": 0}, "monitoring_scrape_interval_s is 0"),
    ({"listen_address": "monitor.local"}, "monitoring_listen_address 'monitor.local' is not an IP address"),
    ({"port": 70000}, "monitoring_port is 70000: set a TCP port"),
    ({"alertmanager_port": 9090}, "must differ"),
    ({"retention_days": 0}, "monitoring_retention_days is 0"),
    ({"webhook_url": "https://user:pw@pager.example/x"}, "is not an http(s) URL without query or credentials"),
    ({"webhook_url": "https://pager.example/x?token=abc"}, "is not an http(s) URL without query or credentials"),
    ({"webhook_url": "ftp://pager.example/x"}, "is not an http(s) URL"),
    ({"targets": []}, "no serving node to scrape"),
    ({"gateway_ca_pem": ""}, "monitoring_gateway_ca_pem is not a PEM certificate"),
])
def test_each_bad_value_is_refused_with_its_fix(kwargs, fix):
    spec = resolve(**kwargs)
    assert any(fix in b for b in spec["blockers"]), spec["blockers"]


@pytest.mark.parametrize("node,node_vars,fix", [
    ("gpu01", published(), "gpu01 has no serving_spec: run the serving role on the nodes first"),
    ("gpu01", published(serving_spec=serving_spec(gateway=False)), "set serving_gateway: true"),
    ("gpu01", published(serving_spec=serving_spec(), gateway_node_address="gpu 01"), "neither an IP nor a host name"),
    ("gpu01", published(serving_spec=serving_spec(profile="b200\nrelease")), "holds a control character"),
    ("gpu01", published(serving_spec=serving_spec(profile='b200",x="1')), "label 'b200\",x=\"1' holds characters"),
    # the ports are what the node's roles resolved (their defaults included), never a second default here
    ("gpu01", {"serving_spec": serving_spec(), "gateway_endpoint": {"port": 8443}},
     "gpu01 has no monitoring_node_spec: run the monitoring_node role on the nodes first"),
    ("gpu01", {"serving_spec": serving_spec(), "monitoring_node_spec": {"exporter_port": 9100, "dcgm_port": 9400}},
     "gpu01 has no gateway_endpoint: run the gateway role's endpoint entry point"),
])
def test_each_bad_node_is_refused_with_its_fix(node, node_vars, fix):
    spec = resolve(targets=[monitoring.node_target(node, node_vars)])
    assert any(fix in b for b in spec["blockers"]), spec["blockers"]


def test_an_engine_with_its_own_key_off_loopback_is_scraped_directly():
    target = monitoring.node_target("gpu01", published(serving_spec=serving_spec(gateway=False, bind_address="10.0.0.5")))
    assert target["blockers"] == [] and target["engine_scrape"]["scheme"] == "http"


def test_an_amd_node_says_why_it_has_no_gpu_exporter():
    target = monitoring.node_target("mi01", published(serving_spec=serving_spec(gpu={"vendor": "amd"})))
    assert target["gpu_exporter"] is None and "AMD's device-metrics exporter" in target["gpu_exporter_skipped"]
    cpu = monitoring.node_target("lab", published(serving_spec=serving_spec(gpu={"vendor": "cpu"})))
    assert cpu["gpu_exporter"] is None and cpu["gpu_exporter_skipped"] is None


def node(**kwargs):
    options = dict(networks=["10.30.0.0/24"], units=["minimax-m3", "nvidia-fabricmanager"], vendor="nvidia",
                   dcgm_image="nvcr.io/nvidia/k8s/dcgm-exporter@" + DIGEST)
    options.update(kwargs)
    return monitoring.monitoring_node_resolve(options.pop("networks"), **options)


def test_node_defaults_resolve():
    spec = node()
    assert spec["blockers"] == [] and spec["ports"] == [9100, 9400] and spec["dcgm"]
    assert "--collector.systemd.unit-include=(minimax-m3|nvidia-fabricmanager)[.]service" in spec["args"]
    assert "\\" not in " ".join(spec["args"])


@pytest.mark.parametrize("kwargs,fix", [
    ({"networks": []}, "monitoring_node_networks is empty: list the monitoring host's network"),
    ({"networks": ["10.30.0.0/33"]}, "entry '10.30.0.0/33' is not a network (CIDR"),
    ({"networks": "10.30.0.0/24"}, "list networks in CIDR form"),
    ({"listen_address": "any"}, "monitoring_node_listen_address 'any' is not an IP address"),
    ({"exporter_port": 0}, "monitoring_node_exporter_port is 0"),
    ({"units": ["minimax-m3.service"]}, "is not a unit name without its .service suffix"),
    ({"units": ["a|b"]}, "is not a unit name"),
    ({"dcgm_image": ""}, "pin NVIDIA's DCGM exporter by digest"),
    ({"dcgm_image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.0-4.5.0-ubuntu22.04"}, "pin NVIDIA's DCGM exporter by digest"),
    ({"dcgm_port": 9100}, "other than the node exporter's"),
])
def test_each_bad_node_setting_is_refused_with_its_fix(kwargs, fix):
    spec = node(**kwargs)
    assert any(fix in b for b in spec["blockers"]), spec["blockers"]


def test_no_gpu_exporter_when_switched_off_or_not_nvidia():
    assert node(gpu_exporter=False, dcgm_image="")["blockers"] == []
    assert node(gpu_exporter=False)["gpu_exporter_skipped"] == "monitoring_node_gpu_exporter is false"
    amd = node(vendor="amd", dcgm_image="")
    assert amd["blockers"] == [] and not amd["dcgm"] and amd["ports"] == [9100]


def test_the_textfile_escapes_label_values():
    text = monitoring.monitoring_textfile(444000000000, '/data/"x"', "/data/models")
    assert 'mm3_weights_revision_bytes{mountpoint="/data/\\"x\\"",weights_root="/data/models"} 444000000000' in text
