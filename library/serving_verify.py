#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the MiniMax-M3 self-hosting project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_verify
short_description: Verify that a MiniMax-M3 server serves what the seed promises
description:
  - Runs on the serving node (the API is bound to loopback) and checks an OpenAI-compatible
    SGLang or vLLM server - readiness that means "can generate", the served model, text
    generation, reasoning separation, tool calls, image input, API-key enforcement and a
    streaming load benchmark.
  - Uses only the Python standard library and Ansible's module_utils (HTTP through
    C(ansible.module_utils.urls)); nothing to install on the node.
  - Returns one result per check (passed, status, detail, seconds) and fails when a requested
    check fails, with a message that names the likely cause and fix from the seed's
    troubleshooting table.
  - Read-only towards the server. Prompts and model outputs are never returned, only lengths,
    parsed tool-call names and markers found.
version_added: "1.0.0"
author: MiniMax-M3 self-hosting project
options:
  base_url:
    description: Base URL of the server, without C(/v1), e.g. C(http://127.0.0.1:30000).
    type: str
    required: true
  api_key:
    description:
      - API key the server was started with (C(--api-key)); sent as an C(Authorization) bearer token.
      - When unset, the C(auth) check is skipped.
    type: str
  model:
    description: Model name to query; defaults to the first id listed by C(/v1/models).
    type: str
  expected_model:
    description: Name the C(models) check requires among the served models.
    type: str
  engine:
    description:
      - Engine behind the URL. C(sglang) answers its health path only after a 1-token
        generation; for C(vllm), whose C(/health) only says the process lives, the
        C(health) check also runs a 1-token generation. Also selects SGLang's
        C(separate_reasoning) request field.
    type: str
    choices: [sglang, vllm]
    default: sglang
  health_path:
    description: Health path of the engine.
    type: str
    default: /health
  checks:
    description:
      - Checks to run, in this order. List C(gateway_rate) after the other C(gateway_*) checks,
        since it spends the limits client's request budget for a minute.
      - The C(gateway_*) checks probe the gateway (roles/gateway) in front of the engine;
        C(base_url) is then the gateway's https URL.
      - Unset, every functional check - C(health), C(models), C(chat), C(reasoning), C(tools),
        C(image), C(auth) - then C(eval) when C(eval_set) is given.
      - The names are defined once, in mm3.shared's serving_verify_checks.py (C(ALL_CHECKS),
        C(default_checks)); a unit test holds these choices to it.
    type: list
    elements: str
    choices: [health, models, chat, reasoning, tools, image, auth, eval, gateway_paths, gateway_body,
              gateway_max_tokens, gateway_media, gateway_tls, gateway_rate, bench]
  capabilities:
    description:
      - The profile's capability boundary (C(serving_spec.capabilities)). When given and
        C(image) is not in it, the C(image) check is skipped with that reason.
    type: list
    elements: str
  profile:
    description:
      - Hardware profile (C(serving_spec.profile)); selects the published reference figures
        for the C(bench) comparison (b200 1580 ms / 24.1 ms, h200 1054 ms / 70.8 ms mean
        TTFT / TPOT).
    type: str
  max_tokens:
    description: C(max_tokens) of the chat, reasoning, tool and image probes (the seed uses 1024).
    type: int
    default: 1024
  temperature:
    description: Sampling temperature of the probes (the seed's 1.0).
    type: float
    default: 1.0
  top_p:
    description: Nucleus sampling of the probes (the seed's 0.95).
    type: float
    default: 0.95
  image_url:
    description: An extra remote image for the C(image) check; must match C(image_url_allowlist).
    type: str
  image_url_allowlist:
    description: URL prefixes (C(scheme://host[/path])) that C(image_url) may start with.
    type: list
    elements: str
    default: []
  ca_path:
    description: CA certificate (PEM) the server's certificate must chain to, e.g. the site CA of the gateway.
    type: path
  gateway:
    description: What the C(gateway_*) checks need to know about the gateway's limits.
    type: dict
    default: {}
    suboptions:
      limits_key:
        description: Key of a client of its own whose limits the checks reach (never the main key).
        type: str
        no_log: true
      rate_per_minute:
        description: That client's request rate limit.
        type: int
      max_body_bytes:
        description: That client's request body limit.
        type: int
      max_tokens:
        description: That client's C(max_tokens) cap.
        type: int
      private_paths:
        description: Engine paths no client may reach through the gateway.
        type: list
        elements: str
        default: []
      blocked_media_url:
        description: An image URL on a host outside the media allowlist.
        type: str
  timeouts:
    description: Timeouts in seconds.
    type: dict
    default: {}
    suboptions:
      health:
        description: How long C(health) keeps polling before it fails.
        type: float
        default: 300
      interval:
        description: Pause between two C(health) attempts.
        type: float
        default: 2
      request:
        description: Timeout of one request.
        type: float
        default: 120
      bench:
        description: Timeout of one streamed benchmark request.
        type: float
        default: 1800
  bench:
    description: Load benchmark settings (the seed's published workload by default).
    type: dict
    default: {}
    suboptions:
      input_len:
        description: Prompt length in tokens (random words, calibrated with the server's tokenizer).
        type: int
        default: 2048
      output_len:
        description: Output tokens per request (C(ignore_eos)).
        type: int
        default: 256
      concurrency:
        description: Requests in flight at once (threads).
        type: int
        default: 64
      num_prompts:
        description: Number of requests.
        type: int
        default: 128
      seed:
        description:
          - Seed of the random prompts. Unset, a fresh seed is drawn (and reported) so a rerun
            against the same server does not hit its prefix cache and report an optimistic TTFT.
        type: int
      tolerance:
        description: Allowed excess over the reference before the comparison warns (0.10 = 10 %).
        type: float
        default: 0.10
      reference:
        description:
          - Reference figures C({ttft_ms, tpot_ms, source}) overriding the built-in ones of
            C(profile). Compared only when the workload equals the reference's (2048/256, 64, 128).
        type: dict
  eval_set:
    description:
      - The evaluation set the C(eval) check runs (a parsed C(evals/*.yml) file, version 1), a
        list of cases, each a prompt and machine-checkable expectations (C(contains), C(not_contains),
        C(reasoning), C(tool_calls), C(json), C(non_empty)), passed when the share of cases that
        pass reaches C(pass_threshold). A case outside C(capabilities) is skipped.
      - Required when C(checks) holds C(eval); refused, naming the fix, before any request.
    type: dict
  report_path:
    description: Write the JSON report here on the node (mode 0640; not in check mode).
    type: path
  validate_certs:
    description: Verify TLS certificates for an https base_url.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: The checks only read from the server, so they also run in check mode; the report file is not written.
  diff_mode:
    support: none
notes:
  - The benchmark mirrors C(vllm bench serve) / C(sglang.bench_serving) definitions - TTFT is the
    first streamed chunk, ITL the gaps between chunks, TPOT = (latency - TTFT) / (output tokens - 1).
  - A C(warn) status on C(bench) means slower than the reference beyond the tolerance; it does not fail the task.
"""

EXAMPLES = r"""
- name: Verify the local server (every functional check)
  serving_verify:
    base_url: http://127.0.0.1:30000
    api_key: "{{ serving_api_key }}"
    engine: sglang
    capabilities: "{{ serving_spec.capabilities }}"
  no_log: true

- name: Run the site's evaluation set after a change (every case must pass)
  serving_verify:
    base_url: http://127.0.0.1:30000
    checks: [health, eval]
    capabilities: "{{ serving_spec.capabilities }}"
    eval_set: "{{ lookup('ansible.builtin.file', 'evals/minimax-m3.yml') | from_yaml }}"

- name: Load benchmark against the published B200 figures
  serving_verify:
    base_url: http://127.0.0.1:30000
    checks: [health, bench]
    profile: b200
    bench: {input_len: 2048, output_len: 256, concurrency: 64, num_prompts: 128}
    report_path: /var/tmp/serving_verify.json
"""

RETURN = r"""
results:
  description: One entry per requested check.
  returned: always
  type: list
  elements: dict
  sample:
    - {name: reasoning, passed: false, skipped: false, status: failed, seconds: 0.42,
       detail: "reasoning markup leaked into content: <think>, </think>",
       cause: "the reasoning parser was not enabled ...", fix: "restore --reasoning-parser auto ..."}
summary:
  description: Counts of passed, failed, skipped and warned checks.
  returned: always
  type: dict
  sample: {passed: 6, failed: 0, skipped: 1, warn: 0, total: 7}
model:
  description: The model queried.
  returned: always
  type: str
base_url:
  description: The URL verified.
  returned: always
  type: str
engine:
  description: The engine option.
  returned: always
  type: str
report:
  description:
    - The whole report (what C(report_path) holds and the controller's summary reads) - base_url,
      engine, model, served_models, profile, the checks run (the default list when C(checks) was
      unset), ca_path, gateway (the limits the C(gateway_*) checks were held to, without the
      key), started_at, seconds, summary, results.
  returned: always
  type: dict
report_path:
  description: Where the JSON report was written (absent in check mode or without report_path).
  returned: when written
  type: str
"""

import datetime
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_checks import (
    ALL_CHECKS,
    Verifier,
    default_checks,
)
from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_eval import eval_problems
from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_core import failure_message
from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_http import Client


def summarize_results(results):
    counts = {"passed": 0, "failed": 0, "skipped": 0, "warn": 0}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    counts["total"] = len(results)
    return counts


def build_report(params, verifier, results, started, seconds):
    return {
        "base_url": params["base_url"],
        "engine": params["engine"],
        "model": verifier.model,
        "served_models": verifier.served,
        "profile": params.get("profile"),
        "checks": params["checks"],
        # what the gateway checks were held to (the limits client's key stays out)
        "ca_path": params.get("ca_path"),
        "gateway": {k: v for k, v in (params.get("gateway") or {}).items() if k != "limits_key"},
        "started_at": started,
        "seconds": round(seconds, 3),
        "summary": summarize_results(results),
        "results": results,
    }


def _fill_defaults(value, defaults):
    merged = dict(defaults)
    merged.update({k: v for k, v in (value or {}).items() if v is not None})
    return merged


TIMEOUT_DEFAULTS = {"health": 300.0, "interval": 2.0, "request": 120.0, "bench": 1800.0}
BENCH_DEFAULTS = {"input_len": 2048, "output_len": 256, "concurrency": 64, "num_prompts": 128,
                  "seed": None, "tolerance": 0.10, "reference": None}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            base_url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str"),
            expected_model=dict(type="str"),
            engine=dict(type="str", choices=["sglang", "vllm"], default="sglang"),
            health_path=dict(type="str", default="/health"),
            checks=dict(type="list", elements="str", choices=ALL_CHECKS),
            capabilities=dict(type="list", elements="str"),
            profile=dict(type="str"),
            max_tokens=dict(type="int", default=1024),
            temperature=dict(type="float", default=1.0),
            top_p=dict(type="float", default=0.95),
            image_url=dict(type="str"),
            image_url_allowlist=dict(type="list", elements="str", default=[]),
            timeouts=dict(type="dict", default={}, options=dict(
                health=dict(type="float", default=300),
                interval=dict(type="float", default=2),
                request=dict(type="float", default=120),
                bench=dict(type="float", default=1800),
            )),
            bench=dict(type="dict", default={}, options=dict(
                input_len=dict(type="int", default=2048),
                output_len=dict(type="int", default=256),
                concurrency=dict(type="int", default=64),
                num_prompts=dict(type="int", default=128),
                seed=dict(type="int"),
                tolerance=dict(type="float", default=0.10),
                reference=dict(type="dict"),
            )),
            ca_path=dict(type="path"),
            gateway=dict(type="dict", default={}, options=dict(
                limits_key=dict(type="str", no_log=True),
                rate_per_minute=dict(type="int"),
                max_body_bytes=dict(type="int"),
                max_tokens=dict(type="int"),
                private_paths=dict(type="list", elements="str", default=[]),
                blocked_media_url=dict(type="str"),
            )),
            eval_set=dict(type="dict"),
            report_path=dict(type="path"),
            validate_certs=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = dict(module.params)
    params["timeouts"] = _fill_defaults(params.get("timeouts"), TIMEOUT_DEFAULTS)
    params["bench"] = _fill_defaults(params.get("bench"), BENCH_DEFAULTS)
    if params["checks"] is None:
        params["checks"] = default_checks(params.get("eval_set"))

    problems = []
    if not params["base_url"].startswith(("http://", "https://")):
        problems.append("base_url must start with http:// or https:// (got %r)" % params["base_url"])
    for key in ("input_len", "output_len", "concurrency", "num_prompts"):
        if params["bench"][key] < 1:
            problems.append("bench.%s must be >= 1" % key)
    for key in ("health", "request", "bench"):
        if params["timeouts"][key] <= 0:
            problems.append("timeouts.%s must be > 0" % key)
    if params["image_url"] and not params["image_url"].startswith(("http://", "https://")):
        problems.append("image_url must be an http(s) URL; the module sends its own data URI anyway")
    if "eval" in params["checks"]:
        problems += ["eval_set: " + p for p in eval_problems(params.get("eval_set"))]
    if problems:
        module.fail_json(msg="invalid options: " + "; ".join(problems), results=[], summary={})

    client = Client(params["base_url"], params.get("api_key"), params["timeouts"]["request"],
                    params["validate_certs"], params.get("ca_path"))
    verifier = Verifier(client, params)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.monotonic()
    results = verifier.run(params["checks"])
    report = build_report(params, verifier, results, started, time.monotonic() - t0)

    out = dict(changed=False, results=results, summary=report["summary"], model=verifier.model,
               base_url=params["base_url"], engine=params["engine"], report=report)
    if params.get("report_path") and not module.check_mode:
        path = params["report_path"]
        try:
            parent = os.path.dirname(path)
            if parent and not os.path.isdir(parent):
                os.makedirs(parent, 0o750)
            tmp = path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(report, handle, indent=2, sort_keys=True)
            os.chmod(tmp, 0o640)
            os.rename(tmp, path)
            out["report_path"] = path
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot write report_path %s: %s" % (path, exc), **out)

    msg = failure_message(results)
    if msg:
        module.fail_json(msg=msg, **out)
    module.exit_json(msg="%d checks passed, %d skipped, %d warn" % (
        report["summary"]["passed"] + report["summary"]["warn"], report["summary"]["skipped"],
        report["summary"]["warn"]), **out)


if __name__ == "__main__":
    main()
