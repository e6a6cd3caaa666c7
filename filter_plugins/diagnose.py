# -*- coding: utf-8 -*-
"""Diagnosis of a serving node, as pure functions (role diagnose, playbooks/diagnose.yml).

The role collects evidence on a node (the unit's journal and the engine's output, kernel
messages, the gateway's journal, the state of the unit, weights, disk, fabric manager and
gateway, the last verification report) and these filters turn it into a ranked diagnosis:

  diagnose_evidence(raw)              what the tasks read, as evidence text per source
  diagnose_state_lines(facts)         the collected state as lines the rules can match
  diagnose_findings(evidence, rules)  every rule whose pattern matches its sources, ranked
  diagnose_redact(text, secrets)      text with every secret (and anything shaped like one) replaced
  diagnose_rules_problems(rules)      what is wrong with a rule table (the role refuses it)
  diagnose_text(report)               the summary for people

The rules are data (roles/diagnose/vars/main.yml): the vendor's troubleshooting table, row by
row, and the failures this project knows, each as pattern -> cause -> fix.
"""
from __future__ import annotations

import base64
import re
import urllib.parse

from ansible.errors import AnsibleFilterError

SOURCES = ("engine", "kernel", "gateway", "state", "verify")
TABLES = ("vendor", "project")
RULE_KEYS = ("id", "table", "symptom", "cause", "fix", "rank", "sources", "match")
MAX_LINE = 300
MAX_EVIDENCE = 3
# Shapes of secrets that may reach a log without being in the inventory: a bearer header, a
# Hugging Face token, a PEM private key (one line of it is enough to be a leak).
SECRET_SHAPES = (
    # A bearer header, an x-api-key header, an api key in every form the engines print it: the
    # flag (--api-key x, --api-key=x), a keyword (api_key=x, SGLang's ServerArgs repr api_key='x'),
    # JSON ("api_key": "x"), and a key in a query string (?key=x, &api_key=x, &token=x).
    (re.compile(r"(?i)(authorization:\s*bearer\s+|x-api-key:\s*|api[_-]key[\"']?(?:\s*[=:]\s*|\s+)[\"']?"
                r"|[?&](?:api_?key|key|token|access_token)=)[^\s\"',&)]+"), r"\1<redacted>"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), "<redacted:hf-token>"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S),
     "<redacted:private-key>"),
)
MIN_SECRET = 8


def diagnose_rules_problems(rules):
    """Problems of a rule table, one string each (empty: usable)."""
    problems, seen = [], set()
    if not isinstance(rules, list) or not rules:
        return ["the rule table is not a non-empty list"]
    for number, rule in enumerate(rules):
        where = "rule %d (%s)" % (number, rule.get("id", "?") if isinstance(rule, dict) else "?")
        if not isinstance(rule, dict):
            problems.append("%s is not a mapping" % where)
            continue
        missing = [k for k in RULE_KEYS if k not in rule]
        if missing:
            problems.append("%s lacks %s" % (where, ", ".join(missing)))
            continue
        if rule["id"] in seen:
            problems.append("%s: the id is used twice" % where)
        seen.add(rule["id"])
        if rule["table"] not in TABLES:
            problems.append("%s: table %r is not one of %s" % (where, rule["table"], ", ".join(TABLES)))
        if not isinstance(rule["rank"], int) or isinstance(rule["rank"], bool) or not 1 <= rule["rank"] <= 3:
            problems.append("%s: rank %r is not 1 (root cause), 2 or 3 (symptom)" % (where, rule["rank"]))
        bad = [s for s in rule["sources"] or [] if s not in SOURCES] if isinstance(rule["sources"], list) else ["?"]
        if bad or not rule["sources"]:
            problems.append("%s: sources %r are not a non-empty list of %s" % (where, rule["sources"], ", ".join(SOURCES)))
        if not isinstance(rule["match"], list) or not rule["match"]:
            problems.append("%s: match is not a non-empty list of patterns" % where)
            continue
        for pattern in rule["match"]:
            try:
                re.compile(str(pattern))
            except re.error as exc:
                problems.append("%s: pattern %r does not compile: %s" % (where, pattern, exc))
        for key in ("symptom", "cause", "fix"):
            if not str(rule[key]).strip():
                problems.append("%s: %s is empty" % (where, key))
    return problems


def secret_forms(secret):
    """The forms a known secret takes in a log besides itself: URL-encoded (a query string, a
    proxy URL), and base64 (a Basic authorization header, a config blob) in both alphabets at any
    of the three byte offsets it can start at inside a longer encoded value, each cut to the
    characters that depend on the secret alone."""
    forms = {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    raw = secret.encode("utf-8")
    for offset in range(3):
        whole = 4 * ((offset + len(raw)) // 3)  # the characters of complete 3-byte groups
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            core = encode(b"\0" * offset + raw).decode("ascii")[4 if offset else 0:whole]
            if len(core) >= MIN_SECRET:
                forms.add(core)
    return forms


def secret_pattern(secrets):
    """One pattern for every form of every secret, each also matched across a line break (a log
    wrapped at 80 columns, a header folded by its client)."""
    forms = sorted({form for secret in secrets for form in secret_forms(secret)}, key=len, reverse=True)
    return re.compile("|".join(r"(?:\r?\n[ \t]*)?".join(re.escape(c) for c in form) for form in forms))


def diagnose_redact(text, secrets=()):
    """Replace every secret of the list (values shorter than 8 characters are ignored: they
    would redact ordinary words), in every form secret_forms lists and across line breaks, and
    anything shaped like one."""
    out = "" if text is None else str(text)
    known = {str(s) for s in secrets or () if s is not None and len(str(s)) >= MIN_SECRET}
    if known:
        out = secret_pattern(known).sub("<redacted>", out)
    for pattern, replacement in SECRET_SHAPES:
        out = pattern.sub(replacement, out)
    return out


def _int(value, default=-1):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _true(value):
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def _gb(nbytes):
    return "%.1f GB" % (float(nbytes) / 1e9)


def diagnose_state_lines(facts):
    """The node's state, one line per fact, in the words the state rules match."""
    f = facts or {}
    lines = []
    unit = f.get("unit") or {}
    if unit:
        lines.append("unit %s: active=%s sub=%s result=%s restarts=%s exit=%s" % (
            f.get("unit_name", "?"), unit.get("ActiveState", "?"), unit.get("SubState", "?"),
            unit.get("Result", "?"), unit.get("NRestarts", "?"), unit.get("ExecMainStatus", "?")))
        if unit.get("LoadState") == "not-found":
            lines.append("unit %s: not installed" % f.get("unit_name", "?"))
    for name in ("marker", "manifest"):
        path = f.get(name + "_path")
        if path is not None:
            lines.append("weights %s %s: %s" % (name, "present" if _true(f.get(name + "_exists")) else "missing", path))
    health = f.get("health")
    if health is not None:
        status = _int(health.get("status"))
        if status == 200:
            lines.append("health %s: status=200" % health.get("url", "?"))
        elif status == -1:
            lines.append("health %s: no answer (%s)" % (health.get("url", "?"), health.get("msg", "")))
        else:
            lines.append("health %s: status=%s" % (health.get("url", "?"), status))
    disk = f.get("disk")
    if disk and disk.get("avail_bytes") is not None:
        need = disk.get("need_bytes")
        verdict = "short" if need and int(disk["avail_bytes"]) < int(need) else "ok"
        lines.append("disk %s: free %s, two revisions need %s: %s" % (
            disk.get("path", "?"), _gb(disk["avail_bytes"]), _gb(need) if need else "?", verdict))
    for name, label in (("fabricmanager", "fabric manager"), ("gateway", "gateway haproxy")):
        state = f.get(name)
        if state not in (None, "", "absent"):
            lines.append("%s: %s" % (label, state))
    fabric = f.get("gpu_fabric") or []
    if fabric:
        counts = {}
        for state in fabric:
            counts[state] = counts.get(state, 0) + 1
        lines.append("gpu fabric: %s%s" % (", ".join("%s on %d of %d GPUs" % (k, v, len(fabric))
                                                     for k, v in sorted(counts.items())),
                                          "" if set(counts) == {"Completed"} else " (need Completed)"))
    burnin = f.get("burnin") or {}
    if burnin.get("status") in ("pass", "fail"):
        lines.append("burn-in %s %s: %s" % ("failed" if burnin["status"] == "fail" else "passed",
                                           burnin.get("finished", "?"),
                                           "; ".join(burnin.get("problems") or []) or burnin.get("summary") or ""))
    release = " ".join(str(f.get("release") or "").split())
    if release:
        # serving_release_line: the key that signed what the node is bound to, or the refusal
        lines.append("release: %s" % release)
    gpus = f.get("gpus")
    if gpus and gpus.get("expected"):
        seen, expected = int(gpus.get("seen") or 0), int(gpus["expected"])
        lines.append("gpus visible %d of %d%s" % (seen, expected, "" if seen >= expected else ": short"))
    return lines


def _systemctl_show(text):
    """`systemctl show -p ...` output (one block per unit, blank-line separated) as dicts."""
    blocks, current = [], {}
    for line in str(text or "").splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        key, _, value = line.partition("=")
        current[key] = value
    if current:
        blocks.append(current)
    return blocks


def _unit_state(blocks, unit_id):
    for block in blocks:
        if block.get("Id") == unit_id:
            return "absent" if block.get("LoadState") == "not-found" else block.get("ActiveState", "unknown")
    return "absent"


def diagnose_episode(text, unit):
    """The unit's journal from its last start by hand or by a playbook on: systemd's automatic
    restarts (after "Scheduled restart job") stay in the episode, an earlier episode that was
    mended by a restart is history, not a finding. systemd's own wording (252 and later):
    "Starting <unit>.service - <description>..." and "<unit>.service: Scheduled restart job,
    restart counter is at N."."""
    lines = str(text or "").splitlines()
    starting = "Starting %s.service" % unit
    begin, automatic = 0, False
    for number, line in enumerate(lines):
        if "Scheduled restart job" in line:
            automatic = True
        elif line.startswith(starting):
            if not automatic:
                begin = number
            automatic = False
    return "\n".join(lines[begin:])


# An access-log line of a request the gateway passed and the engine answered (status 1xx-3xx, no
# refusal): routine traffic, which a busy gateway writes thousands of (roles/gateway's log-format).
ROUTINE_ACCESS = re.compile(r"^mm3-gateway client=\S* src=\S* method=\S* path=\S* status=[123]\d\d .*refusal=-\s*$")


def diagnose_gateway_lines(text, keep=None):
    """The gateway's journal as evidence: HAProxy's own messages and every refused or failed
    request, the routine lines left out, the last `keep` of them. Read as the last N lines, a burst
    of healthy traffic pushed the refusal that explains a symptom out of the window."""
    lines = [line for line in str(text or "").splitlines() if not ROUTINE_ACCESS.match(line)]
    count = _int(keep, 0)
    if count > 0:
        lines = lines[-count:]
    return "\n".join(lines)


def diagnose_evidence(raw):
    """Turn what the role read on a node into evidence: {engine, kernel, gateway, state, verify},
    text each. `raw` holds the command outputs and stats the tasks
    registered (roles/diagnose/vars/main.yml builds it)."""
    r = raw or {}
    logs = r.get("logs") or {}
    if isinstance(logs, list):  # the registered loop results: {__diagnose_log: {source}, stdout, stderr}
        logs = {item.get("__diagnose_log", {}).get("source"): "\n".join(
            t for t in (item.get("stdout") or "", item.get("stderr") or "") if t) for item in logs}
    unit = (_systemctl_show(r.get("unit_show")) or [{}])[0]
    units = _systemctl_show(r.get("units_show"))
    df = r.get("df") or {}
    avail = None
    if _int(df.get("rc")) == 0:
        numbers = [t for t in str(df.get("stdout", "")).split() if t.isdigit()]
        avail = int(numbers[-1]) if numbers else None
    size_gb = r.get("weights_size_gb")
    gpus = r.get("gpus")
    facts = {
        "unit_name": r.get("unit_name"), "unit": unit,
        "marker_path": (r.get("marker") or {}).get("path"), "marker_exists": (r.get("marker") or {}).get("exists"),
        "manifest_path": (r.get("manifest") or {}).get("path"),
        "manifest_exists": (r.get("manifest") or {}).get("exists"),
        "health": r.get("health"),
        "disk": {"path": r.get("weights_root"), "avail_bytes": avail,
                 "need_bytes": int(float(size_gb) * 2e9) if size_gb else None},
        "fabricmanager": _unit_state(units, "nvidia-fabricmanager.service"),
        "gateway": _unit_state(units, "haproxy.service") if _true(r.get("gateway")) else None,
        "gpu_fabric": [str(x) for x in r.get("gpu_fabric") or []],
        "burnin": r.get("burnin") if isinstance(r.get("burnin"), dict) else None,
        "release": r.get("release"),
        "gpus": ({"seen": sum(1 for line in str(gpus.get("stdout", "")).splitlines() if line.startswith("GPU ")),
                  "expected": r.get("gpu_count")} if isinstance(gpus, dict) and _int(gpus.get("rc")) == 0 else None),
    }
    state = diagnose_state_lines(facts)
    verify_lines = []
    for result in (r.get("verify_report") or {}).get("results") or []:
        verify_lines.append("verify %s: %s %s" % (result.get("name"), result.get("status"),
                                                  str(result.get("detail", "")).replace("\n", " ")[:MAX_LINE]))
    return {
        "engine": diagnose_episode(logs.get("engine"), r.get("unit_name")),
        "kernel": str(logs.get("kernel") or ""),
        "gateway": diagnose_gateway_lines(logs.get("gateway"), r.get("log_lines")),
        "state": "\n".join(state),
        "verify": "\n".join(verify_lines),
        # nvidia-smi -q (fabric, ECC, remapped rows, clocks) or rocm-smi, whole, for the bundle.
        "gpu": str((r.get("gpu_query") or {}).get("stdout") or ""),
    }


def diagnose_findings(evidence, rules, secrets=()):
    """Every rule whose pattern matches a line of one of its sources, ranked: root causes
    (rank 1) before consequences (2) and symptoms (3), then by the number of matching lines,
    then in table order. Each finding carries up to three matching lines, redacted."""
    problems = diagnose_rules_problems(rules)
    if problems:
        raise AnsibleFilterError("diagnose: the rule table is not usable: " + "; ".join(problems))
    ev = evidence or {}
    found = []
    for order, rule in enumerate(rules):
        patterns = [re.compile(str(p)) for p in rule["match"]]
        hits = []
        for source in rule["sources"]:
            text = ev.get(source) or ""
            lines = text if isinstance(text, list) else str(text).splitlines()
            for line in lines:
                if any(p.search(line) for p in patterns):
                    hits.append({"source": source,
                                 "line": diagnose_redact(line.strip(), secrets)[:MAX_LINE]})
        if hits:
            found.append((rule["rank"], -len(hits), order, {
                "id": rule["id"], "table": rule["table"], "rank": rule["rank"],
                "symptom": rule["symptom"], "cause": rule["cause"], "fix": rule["fix"],
                "hits": len(hits), "evidence": hits[-MAX_EVIDENCE:],
            }))
    return [item[3] for item in sorted(found, key=lambda t: t[:3])]


def diagnose_text(report):
    """The diagnosis for people: one block per finding, most likely first."""
    r = report or {}
    findings = r.get("findings") or []
    lines = ["== diagnosis of %s (%s): %s" % (
        r.get("host", "?"), r.get("collected_at", "?"),
        "%d finding(s), most likely first" % len(findings) if findings else "no known failure matched")]
    for number, item in enumerate(findings, 1):
        lines.append("%d. [%s] %s (%s table)" % (number, item["id"], item["symptom"], item["table"]))
        lines.append("   cause: %s" % item["cause"])
        lines.append("   fix:   %s" % item["fix"])
        for hit in item["evidence"]:
            lines.append("   seen in %s: %s" % (hit["source"], hit["line"]))
    for line in r.get("state") or []:
        lines.append("   state: %s" % line)
    lines.append("   engine lines read: the unit's journal from its last start by hand or by a playbook")
    return "\n".join(lines)


class FilterModule(object):
    """diagnose_* filters."""

    def filters(self):
        return {
            "diagnose_evidence": diagnose_evidence,
            "diagnose_findings": diagnose_findings,
            "diagnose_redact": diagnose_redact,
            "diagnose_rules_problems": diagnose_rules_problems,
            "diagnose_state_lines": diagnose_state_lines,
            "diagnose_text": diagnose_text,
        }
