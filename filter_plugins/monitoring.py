# -*- coding: utf-8 -*-
"""Filters of the `monitoring` and `monitoring_node` roles: one central check of every value
that reaches a Prometheus, Alertmanager, blackbox or node exporter file or command line.

`monitoring_resolve` turns the site's choices (budgets, `for:` durations, ports, addresses,
the alert webhook) into `monitoring_spec`; `monitoring_targets` turns the serving nodes'
resolved serving_spec into scrape targets (engine through the node's gateway, the gateway's
own exporter, node exporter, the GPU exporter where the node's vendor has one). Neither
raises on bad input: each problem is one line in `blockers` that names the fix, and the roles
refuse before anything changes (tests/unit/test_monitoring_filters.py).
"""
from __future__ import annotations

import re

from ansible_collections.mm3.shared.plugins.module_utils import validation as v

LABEL_RE = re.compile(r"^[A-Za-z0-9_.:@/+-]{1,128}$")
URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/%+-]*)?$")

# Each budget: (lowest, highest, what it is). The alert rules compare against these.
BUDGETS = {
    "ttft_p99_s": (0.05, 600, "time to first token, p99 over 5 min, seconds"),
    "queue_max": (1, 100000, "requests waiting in one engine's queue"),
    "error_ratio": (0.0001, 1, "share of 5xx answers at the gateway over 5 min"),
    "kv_cache_ratio": (0.1, 1, "KV-cache usage, 0..1"),
    "gpu_memory_ratio": (0.1, 1, "GPU framebuffer used, 0..1"),
    "cert_days": (1, 365, "days before the gateway certificate expires"),
    "disk_revisions": (1, 10, "weights revisions the weights root must still have room for"),
}
# Each alert's `for:` (seconds; 0 = fire at the first failing evaluation).
ALERT_FOR = ("engine_down", "not_ready", "error_rate", "queue", "ttft", "kv_cache", "gpu_memory",
             "xid", "fabric_manager", "disk", "cert", "target_down", "logs_dropped")
# The GPU exporter per vendor: NVIDIA's DCGM exporter (a pinned image on the node);
# AMD's device-metrics exporter is not carried yet, so an AMD node is listed with a reason.
GPU_EXPORTERS = {"nvidia": "dcgm"}


def _gpu_skip_reason(vendor, enabled, suffix=""):
    """Why a node runs no GPU exporter (None for a node without GPUs): one wording for the
    monitoring host's targets and the node's own settings."""
    if vendor in (None, "cpu"):
        return None
    if not enabled:
        return "monitoring_node_gpu_exporter is false"
    return "no GPU exporter is carried for vendor %s yet (AMD's device-metrics exporter)%s" % (vendor, suffix)


def _number(value, low, high, integer=False):
    return v.whole_number(value, low, high) if integer else v.number(value, low, high)


def monitoring_resolve(budget=None, alert_for=None, scrape_interval_s=15, listen_address="127.0.0.1",
                       port=9090, alertmanager_port=9093, blackbox_port=9115, retention_days=15,
                       webhook_url="", targets=None, gateway_ca_pem=None):
    """monitoring_spec for the monitoring host. Never raises; see the module docstring."""
    blockers = []
    resolved_budget = {}
    for key, (low, high, what) in BUDGETS.items():
        raw = (budget or {}).get(key)
        value = _number(raw, low, high, integer=key in ("queue_max", "cert_days", "disk_revisions"))
        if value is None:
            blockers.append("monitoring_budget.%s is %r: set %s between %s and %s."
                            % (key, raw, what, low, high))
        resolved_budget[key] = value
    for key in sorted(set(budget or {}) - set(BUDGETS)):
        blockers.append("monitoring_budget.%s is not a budget; known: %s." % (key, ", ".join(BUDGETS)))
    resolved_for = {}
    for key in ALERT_FOR:
        raw = (alert_for or {}).get(key)
        value = _number(raw, 0, 86400, integer=True)
        if value is None:
            blockers.append("monitoring_alert_for.%s is %r: set whole seconds between 0 and 86400."
                            % (key, raw))
        resolved_for[key] = value
    for key in sorted(set(alert_for or {}) - set(ALERT_FOR)):
        blockers.append("monitoring_alert_for.%s names no alert; known: %s." % (key, ", ".join(ALERT_FOR)))
    interval = _number(scrape_interval_s, 1, 300, integer=True)
    if interval is None:
        blockers.append("monitoring_scrape_interval_s is %r: set whole seconds between 1 and 300."
                        % (scrape_interval_s,))
    problem = v.bind_address_problem(listen_address, "monitoring_listen_address")
    if problem:
        blockers.append(problem + " (127.0.0.1: reach the UI through an SSH tunnel; or this host's "
                        "address on the operators' network.)")
    ports = {}
    for name, value in (("monitoring_port", port), ("monitoring_alertmanager_port", alertmanager_port),
                        ("monitoring_blackbox_port", blackbox_port)):
        ports[name] = _number(value, 1, 65535, integer=True)
        if ports[name] is None:
            blockers.append("%s is %r: set a TCP port between 1 and 65535." % (name, value))
    if len({p for p in ports.values() if p}) < len([p for p in ports.values() if p]):
        blockers.append("monitoring_port, monitoring_alertmanager_port and monitoring_blackbox_port "
                        "must differ: %s." % ", ".join("%s=%s" % kv for kv in ports.items()))
    retention = _number(retention_days, 1, 3650, integer=True)
    if retention is None:
        blockers.append("monitoring_retention_days is %r: set whole days between 1 and 3650." % (retention_days,))
    webhook = str(webhook_url or "")
    if webhook and not URL_RE.match(webhook):
        blockers.append("monitoring_alert_webhook_url %r is not an http(s) URL without query or "
                        "credentials: point it at the site's alert receiver, or leave it empty." % webhook)
    targets = targets or []
    if not targets:
        blockers.append("no serving node to scrape: the `nodes` group (monitoring_nodes_group) is empty.")
    for target in targets:
        blockers.extend(target.get("blockers", []))
    if any(t.get("gateway") for t in targets) and "-----BEGIN CERTIFICATE-----" not in str(gateway_ca_pem or ""):
        blockers.append("monitoring_gateway_ca_pem is not a PEM certificate: set it to the CA that signed "
                        "the nodes' gateway certificates (default gateway_tls_ca_pem); every scrape "
                        "through a gateway is verified against it.")
    spec = {
        "budget": resolved_budget, "alert_for": resolved_for, "scrape_interval_s": interval,
        "listen_address": str(listen_address), "port": ports["monitoring_port"],
        "alertmanager_port": ports["monitoring_alertmanager_port"],
        "blackbox_port": ports["monitoring_blackbox_port"], "retention_days": retention,
        "webhook_url": webhook, "targets": targets, "blockers": blockers,
    }
    blockers.extend(v.control_problems({k: item for k, item in spec.items() if k != "blockers"}, "monitoring"))
    return spec


def release_label(serving_spec):
    """What runs on a node, as one label value: weights revision (12) @ image digest (12) or tag."""
    spec = serving_spec or {}
    revision = str((spec.get("weights") or {}).get("revision") or "unpinned")[:12]
    image = spec.get("image") or {}
    digest = str(image.get("digest") or "")
    return "%s@%s" % (revision, digest.split(":", 1)[-1][:12] if digest else (image.get("tag") or "untagged"))


def node_target(node, node_vars):
    """One serving node's scrape targets, from what the node's own roles resolved, each with its
    role's defaults (playbooks/monitor.yml runs them on the nodes first): serving_spec, the
    exporters' ports (monitoring_node_spec) and, behind a gateway, its port (gateway_endpoint,
    the gateway role's read-only entry point). Blockers name what is missing."""
    spec = node_vars.get("serving_spec") or {}
    exporters = node_vars.get("monitoring_node_spec") or {}
    node_exporter_port = exporters.get("exporter_port")
    dcgm_port = exporters.get("dcgm_port")
    blockers = []
    if not exporters:
        blockers.append("node %s has no monitoring_node_spec: run the monitoring_node role on the nodes "
                        "first (playbooks/monitor.yml does)." % node)
    address = str(node_vars.get("gateway_node_address") or node_vars.get("monitoring_node_address") or node)
    if not v.is_host(address):
        blockers.append("node %s: address %r is neither an IP nor a host name: set "
                        "gateway_node_address for it." % (node, address))
    if not spec:
        blockers.append("node %s has no serving_spec: run the serving role on the nodes first "
                        "(playbooks/monitor.yml does)." % node)
    gateway = bool(spec.get("gateway"))
    gateway_port = (node_vars.get("gateway_endpoint") or {}).get("port")
    if gateway and gateway_port is None:
        blockers.append("node %s has no gateway_endpoint: run the gateway role's endpoint entry point on "
                        "the nodes first (playbooks/monitor.yml does)." % node)
    vendor = (spec.get("gpu") or {}).get("vendor")
    gpu_exporter = GPU_EXPORTERS.get(vendor)
    if gateway:
        engine = {"scheme": "https", "port": gateway_port, "path": "/metrics"}
    else:
        bind = str(spec.get("bind_address") or "127.0.0.1")
        if not v.is_ip(bind) or v.is_loopback(bind):
            blockers.append("node %s: its engine listens on loopback with no gateway in front, so no "
                            "monitoring host can scrape it: set serving_gateway: true (and "
                            "gateway_metrics_networks to the monitoring host's network)." % node)
        engine = {"scheme": "http", "port": spec.get("port") or 30000, "path": "/metrics"}
    target = {
        "node": str(node), "address": address, "engine": spec.get("engine") or "unknown",
        "profile": spec.get("profile") or "unknown", "release": release_label(spec),
        "gateway": gateway, "gateway_port": gateway_port, "engine_scrape": engine,
        "node_exporter_port": node_exporter_port, "vendor": vendor or "none",
        "gpu_exporter": gpu_exporter, "gpu_exporter_port": dcgm_port if gpu_exporter else None,
        "gpu_exporter_skipped": None if gpu_exporter else
        _gpu_skip_reason(vendor, True, ": GPU memory and Xid alerts do not cover this node"),
        "blockers": blockers,
    }
    for where, value in (("release", target["release"]), ("engine", target["engine"]),
                         ("profile", target["profile"])):
        if not LABEL_RE.match(value):
            blockers.append("node %s: %s label %r holds characters a label value here may not: "
                            "fix the node's serving settings." % (node, where, value))
    return target


def monitoring_targets(nodes, hostvars):
    return [node_target(n, hostvars[n]) for n in nodes or []]


UNIT_RE = re.compile(r"^[A-Za-z0-9_@-]{1,64}$")


def _listen(address, port):
    return "[%s]:%s" % (address, port) if ":" in str(address) else "%s:%s" % (address, port)


def monitoring_node_resolve(networks, listen_address="0.0.0.0", exporter_port=9100, units=None,
                            gpu_exporter=True, dcgm_image="", dcgm_port=9400, vendor=None,
                            textfile_dir="/var/lib/prometheus/node-exporter"):
    """monitoring_node_spec for one serving node: the exporters' arguments, ports and the
    firewall's networks. Never raises; each problem is one line in blockers naming the fix."""
    blockers = []
    nets, problems = v.networks(networks, "monitoring_node_networks")
    blockers += problems
    if not nets and not problems:
        blockers.append("monitoring_node_networks is empty: list the monitoring host's network (CIDR); "
                        "it defaults to gateway_metrics_networks, which the monitoring host needs too.")
    problem = v.bind_address_problem(listen_address, "monitoring_node_listen_address")
    if problem:
        blockers.append(problem + " (0.0.0.0: the firewall admits the monitoring networks only; or the "
                        "node's own address.)")
    port = _number(exporter_port, 1, 65535, integer=True)
    if port is None:
        blockers.append("monitoring_node_exporter_port is %r: set a TCP port between 1 and 65535."
                        % (exporter_port,))
    units = units if isinstance(units, list) else []
    for unit in units:
        if not UNIT_RE.match(str(unit)):
            blockers.append("monitoring_node_units entry %r is not a unit name without its .service "
                            "suffix (letters, digits, _ @ -): fix monitoring_node_units." % (unit,))
    dcgm = bool(gpu_exporter) and GPU_EXPORTERS.get(vendor) == "dcgm"
    gpu_port = _number(dcgm_port, 1, 65535, integer=True) if dcgm else None
    image = str(dcgm_image or "")
    if dcgm:
        if gpu_port is None or gpu_port == port:
            blockers.append("monitoring_node_dcgm_port is %r: set a TCP port between 1 and 65535 other "
                            "than the node exporter's." % (dcgm_port,))
        if not v.is_digest_reference(image):
            blockers.append("monitoring_node_dcgm_image is %r: on an NVIDIA node pin NVIDIA's DCGM "
                            "exporter by digest (nvcr.io/nvidia/k8s/dcgm-exporter@sha256:<64 hex>, the "
                            "RepoDigests after a pull; load it on the node from the site registry mirror), or "
                            "set monitoring_node_gpu_exporter: false to run without GPU alerts."
                            % (image or ""))
    args = ["--web.listen-address=%s" % _listen(listen_address, port),
            "--collector.systemd",
            # [.] rather than \. : the package's EnvironmentFile keeps no backslash as written.
            "--collector.systemd.unit-include=(%s)[.]service" % "|".join(str(u) for u in units),
            "--collector.textfile.directory=%s" % textfile_dir]
    spec = {"networks": nets, "listen_address": str(listen_address), "exporter_port": port,
            "ports": [p for p in (port, gpu_port) if p], "args": args if units else args[:1] + args[3:],
            "dcgm": dcgm, "dcgm_image": image if dcgm else "", "dcgm_port": gpu_port,
            "gpu_exporter_skipped": None if dcgm else _gpu_skip_reason(vendor, gpu_exporter),
            "blockers": blockers}
    blockers.extend(v.control_problems({k: item for k, item in spec.items() if k != "blockers"}, "monitoring_node"))
    return spec


def monitoring_blockers_text(spec):
    return "\n".join(["monitoring: refused:"] + ["  - " + b for b in spec.get("blockers", [])])


def monitoring_textfile(revision_bytes, mountpoint, weights_root):
    """The node exporter textfile the weights-disk alert reads: one revision's size and the
    mount point that holds the weights root (node_filesystem_avail_bytes has the same label)."""
    def esc(value):
        return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return ("# HELP mm3_weights_revision_bytes Bytes of the weights revision this node serves "
            "(its manifest), on the mount point of the weights root.\n"
            "# TYPE mm3_weights_revision_bytes gauge\n"
            'mm3_weights_revision_bytes{mountpoint="%s",weights_root="%s"} %d\n'
            % (esc(mountpoint), esc(weights_root), int(revision_bytes)))


class FilterModule(object):
    """monitoring_resolve, monitoring_targets, monitoring_node_resolve, monitoring_blockers_text,
    monitoring_textfile."""

    def filters(self):
        return {
            "monitoring_resolve": monitoring_resolve,
            "monitoring_targets": monitoring_targets,
            "monitoring_blockers_text": monitoring_blockers_text,
            "monitoring_textfile": monitoring_textfile,
            "monitoring_node_resolve": monitoring_node_resolve,
        }
