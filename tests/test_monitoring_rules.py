"""The monitoring role's files against the real tools: the alert rules rendered from the role's
template with its default budgets pass `promtool check rules` and the hand-written
`promtool test rules` cases (tests/monitoring/: each alert fires, stays quiet and resolves);
prometheus.yml rendered for a serving fleet passes `promtool check config`; alertmanager.yml
passes `amtool check-config`. promtool and amtool come from Debian's packages, the ones the role
installs (scripts/bootstrap.sh unpacks them into .cache/tools/bin). The lab then runs the same
files on the staging host and makes MM3EngineDown fire and resolve (lab/drill.yml).

The dashboard: every panel's query parses (promtool, as a recording rule) and reads only metric
names that the real exporters publish (tests/fixtures/monitoring/, each recorded from a named
source), so a renamed engine metric cannot leave a panel silently empty."""
import json
import os
import re
import shutil
import subprocess

import jinja2
import pytest
import yaml

from helpers import ROOT, load_source

monitoring = load_source("mm3_monitoring_filters", os.path.join(ROOT, "filter_plugins", "monitoring.py"))
ROLE = os.path.join(ROOT, "roles", "monitoring")
TESTS = os.path.join(ROOT, "tests", "monitoring")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "monitoring")
TOOLS = os.path.join(ROOT, ".cache", "tools", "bin")


def tool(name):
    path = shutil.which(name, path=TOOLS + os.pathsep + os.environ.get("PATH", ""))
    assert path, "%s is missing: run scripts/bootstrap.sh (it unpacks Debian's package)" % name
    return path


def role_vars():
    with open(os.path.join(ROLE, "vars", "main.yml")) as handle:
        return yaml.safe_load(handle)


def render(name, context, role=ROLE):
    """Render one of a role's templates as Ansible does, honouring a `#jinja2:` header line and
    providing Ansible's `search` test."""
    with open(os.path.join(role, "templates", name)) as handle:
        text = handle.read()
    options = {"trim_blocks": True}
    if text.startswith("#jinja2:"):
        header, text = text.split("\n", 1)
        for item in re.findall(r"(\w+)\s*:\s*('[^']*'|\w+)", header[len("#jinja2:"):]):
            key, value = item
            options[key] = value.strip("'") if value.startswith("'") else value == "True"
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, **options)
    env.tests["search"] = lambda value, pattern: re.search(pattern, value) is not None  # Ansible's test
    return env.from_string(text).render(**context)


def target(node, engine="vllm", gateway=True, vendor="nvidia"):
    spec = {"engine": engine, "profile": "h200", "gateway": gateway, "bind_address": "127.0.0.1",
            "port": 30000, "gpu": {"vendor": vendor}, "weights": {"revision": "a" * 40},
            "image": {"digest": "sha256:" + "b" * 64}}
    # as the nodes' roles publish them in playbooks/monitor.yml (their defaults)
    return monitoring.node_target(node, {"serving_spec": spec, "gateway_endpoint": {"port": 8443},
                                         "monitoring_node_spec": {"exporter_port": 9100, "dcgm_port": 9400}})


def spec_with(budget=None, alert_for=None, targets=None, **kwargs):
    v = role_vars()
    spec = monitoring.monitoring_resolve(
        budget=dict(v["__monitoring_budget_defaults"], **(budget or {})),
        alert_for=dict(v["__monitoring_alert_for_defaults"], **(alert_for or {})),
        targets=targets if targets is not None else [target("n1"), target("n2", "sglang")],
        gateway_ca_pem="-----BEGIN CERTIFICATE-----\n(test)\n-----END CERTIFICATE-----\n", **kwargs)
    assert not spec["blockers"], spec["blockers"]
    return spec


def context(tmp_path, spec):
    v = role_vars()
    ca = tmp_path / "ca.pem"
    ca.write_text("(promtool checks only that the CA file exists)\n")
    return dict(v, monitoring_spec=spec, __monitoring_rules_file=str(tmp_path / "mm3-alerts.rules.yml"),
                __monitoring_ca_file=str(ca), __monitoring_listen="127.0.0.1")


def write_rules(tmp_path, spec, keep_annotations=True):
    rules = yaml.safe_load(render("mm3-alerts.rules.yml.j2", context(tmp_path, spec)))
    if not keep_annotations:
        for group in rules["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
    path = tmp_path / "mm3-alerts.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path, rules


def promtool(*args, cwd=None):
    return subprocess.run([tool("promtool")] + list(args), capture_output=True, text=True, cwd=cwd)


def run_rule_tests(tmp_path, spec, test_file, keep_annotations):
    write_rules(tmp_path, spec, keep_annotations)
    shutil.copy(os.path.join(TESTS, test_file), tmp_path / test_file)
    return promtool("test", "rules", test_file, cwd=str(tmp_path))


def alert_names(rules):
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_rules_pass_promtool_check(tmp_path):
    path, rules = write_rules(tmp_path, spec_with())
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout, result.stdout
    # Each names its fix: a runbook that points at a playbook, a setting or a command.
    for group in rules["groups"]:
        for rule in group["rules"]:
            runbook = rule["annotations"]["runbook"]
            assert re.search(r"playbooks/|gateway_|serving_|monitoring_|systemctl|journalctl", runbook), rule["alert"]
            assert "[[" not in runbook and "{{ $labels" in runbook + rule["annotations"]["summary"], rule["alert"]


def test_every_alert_fires_stays_quiet_and_resolves(tmp_path):
    result = run_rule_tests(tmp_path, spec_with(), "mm3-alerts.test.yml", keep_annotations=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # Every alert of the rules file has a case where it fires and one where it does not.
    _, rules = write_rules(tmp_path, spec_with())
    with open(os.path.join(TESTS, "mm3-alerts.test.yml")) as handle:
        cases = [c for t in yaml.safe_load(handle)["tests"] for c in t["alert_rule_test"]]
    for name in alert_names(rules):
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine) and any(not c["exp_alerts"] for c in mine), name


def test_the_runbook_reaches_the_operator_rendered(tmp_path):
    result = run_rule_tests(tmp_path, spec_with(), "mm3-alerts-annotations.test.yml", keep_annotations=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("budget,alert_for", [
    ({"queue_max": 40}, {}),            # the queue of 30 is now inside the budget
    ({"ttft_p99_s": 12}, {}),           # a p99 of 9.9 s is inside
    ({"error_ratio": 0.2}, {}),         # 10 % 5xx is inside
    ({}, {"engine_down": 600}),         # down for 3 minutes does not yet fire
    ({"disk_revisions": 1}, {}),        # one revision of 444 GB fits in 800 GB
])
def test_the_cases_fail_when_a_threshold_moves(tmp_path, budget, alert_for):
    """The cases are not satisfied by any rules file: move one budget or duration and
    promtool reports the alert that no longer fires."""
    result = run_rule_tests(tmp_path, spec_with(budget, alert_for), "mm3-alerts.test.yml", keep_annotations=False)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr, result.stdout


def test_prometheus_config_passes_promtool(tmp_path):
    targets = [target("mm3-lab-node1"), target("10.0.0.7", "sglang"),
               target("n3", gateway=False, vendor="amd")]
    spec = monitoring.monitoring_resolve(
        budget=role_vars()["__monitoring_budget_defaults"], alert_for=role_vars()["__monitoring_alert_for_defaults"],
        targets=targets, gateway_ca_pem="")
    assert any("monitoring_gateway_ca_pem is not a PEM certificate" in b for b in spec["blockers"])
    # n3 has no gateway and a loopback engine: refused, with the fix.
    assert any("set serving_gateway: true" in b for b in spec["blockers"]), spec["blockers"]
    spec = spec_with(targets=targets[:2])
    ctx = context(tmp_path, spec)
    write_rules(tmp_path, spec)
    config = tmp_path / "prometheus.yml"
    config.write_text(render("prometheus.yml.j2", ctx))
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    parsed = yaml.safe_load(config.read_text())
    jobs = {job["job_name"]: job for job in parsed["scrape_configs"]}
    assert sorted(jobs) == ["mm3_engine", "mm3_gateway", "mm3_gpu", "mm3_health", "mm3_node"]
    assert jobs["mm3_engine"]["static_configs"][0]["targets"] == ["mm3-lab-node1:8443"]
    assert jobs["mm3_gateway"]["metrics_path"] == "/gateway/metrics"
    assert jobs["mm3_health"]["static_configs"][1]["targets"] == ["https://10.0.0.7:8443/health"]
    labels = jobs["mm3_node"]["static_configs"][0]["labels"]
    assert labels == {"node": "mm3-lab-node1", "engine": "vllm", "profile": "h200",
                      "release": "aaaaaaaaaaaa@bbbbbbbbbbbb"}


@pytest.mark.parametrize("webhook", ["", "https://pager.example.net/hooks/mm3"])
def test_alertmanager_config_passes_amtool(tmp_path, webhook):
    spec = spec_with(webhook_url=webhook)
    config = tmp_path / "alertmanager.yml"
    config.write_text(render("alertmanager.yml.j2", context(tmp_path, spec)))
    result = subprocess.run([tool("amtool"), "check-config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("webhook_configs" in config.read_text()) is bool(webhook)


def exposed_names():
    """Metric names the real exporters publish, from the recorded expositions."""
    names = set()
    for name in os.listdir(FIXTURES):
        if name.endswith(".prom"):
            with open(os.path.join(FIXTURES, name)) as handle:
                for line in handle:
                    match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{|\s)", line)
                    if match and not line.startswith("#"):
                        names.add(match.group(1))
    return names


def query_names(expr):
    """(bare metric names, alternative groups) a PromQL expression reads: a group is one
    `__name__=~"a|b"` matcher, which lists an engine's names across its releases."""
    groups = [set(alternatives.split("|")) for alternatives in re.findall(r'__name__=~"([^"]+)"', expr)]
    stripped = re.sub(r'\{[^}]*\}', "{}", expr)
    stripped = re.sub(r'"[^"]*"', '""', stripped)
    bare = {token for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped)
            if token.startswith(("vllm:", "sglang:", "haproxy_", "node_", "DCGM_", "probe_", "mm3_"))
            or token == "up"}
    return bare, groups


def dashboard():
    with open(os.path.join(ROLE, "files", "mm3-dashboard.json")) as handle:
        return json.load(handle)


def test_alerts_and_dashboard_read_only_metrics_the_exporters_publish(tmp_path):
    """Every bare metric name is published by a real exporter; every list of alternatives
    holds a published name for each engine it names (engines rename metrics between releases:
    vLLM's gpu_cache_usage_perc became kv_cache_usage_perc, so a list may keep the old one)."""
    published = exposed_names() | {"up"}
    _, rules = write_rules(tmp_path, spec_with())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    missing = []
    for expr in exprs:
        bare, groups = query_names(expr)
        missing += ["%s in %s" % (name, expr) for name in bare if name not in published]
        for group in groups:
            for engine in {name.split(":")[0] for name in group}:
                if not {n for n in group if n.startswith(engine + ":")} & published:
                    missing.append("no published %s name among %s" % (engine, sorted(group)))
    assert not missing, missing


def test_dashboard_panels_parse_and_cover_the_articles_panels(tmp_path):
    board = dashboard()
    panels = [p for p in board["panels"] if p.get("targets")]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "mm3:panel_%d_%d" % (i, j), "expr": t["expr"].replace("$node", "n1").replace("$release", "r")}
        for i, p in enumerate(panels) for j, t in enumerate(p["targets"])]}]}
    path = tmp_path / "panels.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    titles = " | ".join(p["title"] for p in panels).lower()
    for wanted in ("time to first token", "time per output token", "throughput", "queue", "errors",
                   "gpu memory", "kv cache"):
        assert wanted in titles, (wanted, titles)
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"node", "release"} <= variables
    # Per node and per release: every engine/gateway panel groups or filters by both.
    for panel in panels:
        for t in panel["targets"]:
            assert "$node" in t["expr"], panel["title"]


NODE_ROLE = os.path.join(ROOT, "roles", "monitoring_node")


def render_node(name, node_spec):
    with open(os.path.join(NODE_ROLE, "vars", "main.yml")) as handle:
        node_vars = yaml.safe_load(handle)
    return render(name, dict(node_vars, monitoring_node_spec=node_spec), role=NODE_ROLE)


NVIDIA_NODE = monitoring.monitoring_node_resolve(
    ["10.30.0.0/24", "fd00:30::/64"], units=["minimax-m3", "nvidia-fabricmanager"], vendor="nvidia",
    dcgm_image="nvcr.io/nvidia/k8s/dcgm-exporter@sha256:" + "c" * 64)


def test_the_nvidia_nodes_gpu_exporter_unit_runs_the_pinned_image(tmp_path):
    """The DCGM exporter as its README runs it (--gpus all, SYS_ADMIN, port 9400), by digest;
    the unit passes systemd-analyze verify (with the STAND-IN docker of tests/test_plan_golden.py)."""
    from test_plan_golden import systemd_verify
    assert NVIDIA_NODE["blockers"] == []
    unit = tmp_path / "mm3-dcgm-exporter.service"
    unit.write_text(render_node("mm3-dcgm-exporter.service.j2", NVIDIA_NODE))
    start = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))
    assert start.split()[1:] == ["run", "--rm", "--name", "mm3-dcgm-exporter", "--gpus", "all", "--cap-add",
                                 "SYS_ADMIN", "-p", "0.0.0.0:9400:9400",
                                 "nvcr.io/nvidia/k8s/dcgm-exporter@sha256:" + "c" * 64]
    if shutil.which("systemd-analyze"):
        assert systemd_verify(tmp_path, [unit]) == []


def test_the_exporters_firewall_admits_the_monitoring_networks_only(tmp_path):
    """The rendered table: both exporter ports accepted from each monitoring network, dropped for
    everyone else; `nft -c` parses it where nft may run (root)."""
    text = render_node("firewall.nft.j2", NVIDIA_NODE)
    assert "tcp dport { 9100, 9400 } ip saddr { 10.30.0.0/24 } accept" in text
    assert "tcp dport { 9100, 9400 } ip6 saddr { fd00:30::/64 } accept" in text
    assert text.index("accept\n        tcp dport { 9100, 9400 } drop") > text.index("ip6 saddr")
    path = tmp_path / "firewall.nft"
    path.write_text(text)
    if shutil.which("nft") and os.geteuid() == 0:
        result = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True)
        if "Operation not permitted" not in result.stderr:
            assert result.returncode == 0, result.stderr
