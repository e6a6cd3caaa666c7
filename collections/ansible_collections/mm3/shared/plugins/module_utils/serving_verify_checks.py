# -*- coding: utf-8 -*-
# The serving_verify checks: each sends the seed's probes through a Client
# (module_utils/serving_verify_http.py) and judges the answers with the pure functions of
# module_utils/serving_verify_core.py. One result dict per check; nothing raises.
from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_core import (
    CHAT_PROMPT,
    REASONING_PROMPT,
    REFERENCE_FIGURES,
    TOOL_CASES,
    TOOLS,
    bench_metrics,
    bench_prompts,
    check_result,
    compare_reference,
    decode_stream_events,
    find_reasoning_leaks,
    find_tool_leaks,
    image_messages,
    parse_sse_line,
    png_data_uri,
    random_prompt,
    reasoning_of,
    request_timings,
    url_allowed,
    validate_tool_calls,
)
from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_eval import case_capability, eval_judge, eval_request
from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_gateway import GATEWAY_CHECKS, GatewayChecks

# The check names, defined here once: the module's `checks` choices are ALL_CHECKS (its
# DOCUMENTATION is held to it by tests/unit/test_serving_verify.py), the module's default is
# default_checks(), and roles/serving_verify passes no list of its own unless a site sets one.
FUNCTIONAL_CHECKS = ["health", "models", "chat", "reasoning", "tools", "image", "auth"]
ALL_CHECKS = FUNCTIONAL_CHECKS + ["eval"] + GATEWAY_CHECKS + ["bench"]
HEALTH_PROMPT = "Say OK."


def default_checks(eval_set=None):
    """The checks run when none are asked for: every functional check, then the evaluation set
    when one is given (the module refuses `eval` without a set)."""
    return FUNCTIONAL_CHECKS + (["eval"] if eval_set else [])


def _message(resp):
    """choices[0].message of a chat completion body, or None."""
    body = resp.body if isinstance(resp.body, dict) else {}
    choices = body.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    return choices[0].get("message") or {}


def _http_diagnosis(resp, default):
    if resp.status in (401, 403):
        return "auth"
    if resp.status is None:
        return "unreachable"
    return default


class Verifier(GatewayChecks):
    def __init__(self, client, params, clock=time.monotonic, sleep=time.sleep):
        self.client = client
        self.p = params
        self.clock = clock
        self.sleep = sleep
        self.model = params.get("model")
        self.served = None

    # ------------------------------------------------------------------ helpers
    @property
    def timeouts(self):
        return self.p["timeouts"]

    def resolve_model(self):
        """The model to query: the option, else the first id of /v1/models."""
        if self.model:
            return self.model, None
        resp = self.client.get("/v1/models", timeout=self.timeouts["request"])
        if not resp.ok:
            return None, resp
        ids = [m.get("id") for m in (resp.body or {}).get("data", []) if isinstance(m, dict)]
        self.served = ids
        if ids:
            self.model = ids[0]
        return self.model, resp

    def _chat(self, messages, max_tokens=None, **extra):
        payload = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens or self.p["max_tokens"],
            "temperature": self.p["temperature"],
            "top_p": self.p["top_p"],
        }
        payload.update(extra)
        return self.client.post("/v1/chat/completions", payload, timeout=self.timeouts["request"])

    def _need_model(self, name, start):
        model, resp = self.resolve_model()
        if model:
            return None
        why = resp.describe() if resp is not None else "no model served"
        return check_result(name, False, "cannot determine the model from /v1/models: %s" % why,
                            self.clock() - start, diagnosis=_http_diagnosis(resp, "model") if resp else "model")

    # ------------------------------------------------------------------ checks
    def check_health(self):
        """Readiness that means "can generate": the engine's health path answers 200 and (vLLM,
        whose /health only says the process lives) a 1-token generation succeeds. Polls until
        the health timeout."""
        start = self.clock()
        deadline = start + self.timeouts["health"]
        attempts = 0
        last = "not tried"
        diag = "unreachable"
        while True:
            attempts += 1
            remaining = max(1.0, deadline - self.clock())
            per_try = min(self.timeouts["request"], remaining)
            resp = self.client.get(self.p["health_path"], timeout=per_try)
            if resp.ok:
                if self.p["engine"] == "sglang":
                    return check_result("health", True, "%s answered 200 (SGLang generates one token "
                                        "for it) after %d attempt(s)" % (self.p["health_path"], attempts),
                                        self.clock() - start, data={"attempts": attempts})
                model, mresp = self.resolve_model()
                if not model:
                    last = "/v1/models: %s" % (mresp.describe() if mresp else "no model served")
                    diag = _http_diagnosis(mresp, "not_ready") if mresp else "not_ready"
                else:
                    payload = {"model": model, "messages": [{"role": "user", "content": HEALTH_PROMPT}],
                               "max_tokens": 1}
                    gen = self.client.post("/v1/chat/completions", payload, timeout=per_try)
                    if gen.ok and _message(gen) is not None:
                        return check_result("health", True, "%s answered 200 and a 1-token generation "
                                            "succeeded after %d attempt(s)" % (self.p["health_path"], attempts),
                                            self.clock() - start, data={"attempts": attempts})
                    last = "1-token generation: %s" % gen.describe()
                    diag = _http_diagnosis(gen, "not_ready")
            else:
                last = "%s: %s" % (self.p["health_path"], resp.describe())
                diag = "unreachable" if resp.status is None else "not_ready"
            if diag == "auth":
                break
            if self.clock() + self.timeouts["interval"] >= deadline:
                break
            self.sleep(self.timeouts["interval"])
        return check_result("health", False, "not ready after %d attempt(s) in %.0f s; last: %s"
                            % (attempts, self.clock() - start, last), self.clock() - start,
                            diagnosis=diag, data={"attempts": attempts})

    def check_models(self):
        start = self.clock()
        resp = self.client.get("/v1/models", timeout=self.timeouts["request"])
        if not resp.ok:
            return check_result("models", False, "/v1/models: %s" % resp.describe(), self.clock() - start,
                                diagnosis=_http_diagnosis(resp, "model"))
        ids = [m.get("id") for m in (resp.body or {}).get("data", []) if isinstance(m, dict)]
        self.served = ids
        if not self.model and ids:
            self.model = ids[0]
        expected = self.p.get("expected_model")
        data = {"served": ids}
        if not ids:
            return check_result("models", False, "/v1/models lists no model", self.clock() - start,
                                diagnosis="model", data=data)
        if expected and expected not in ids:
            return check_result("models", False, "expected model %r is not served (served: %s)"
                                % (expected, ", ".join(ids)), self.clock() - start, diagnosis="model", data=data)
        return check_result("models", True, "serves %s" % ", ".join(ids), self.clock() - start, data=data)

    def check_chat(self):
        start = self.clock()
        failed = self._need_model("chat", start)
        if failed:
            return failed
        resp = self._chat([{"role": "user", "content": CHAT_PROMPT}])
        if not resp.ok:
            return check_result("chat", False, "chat completion: %s" % resp.describe(), self.clock() - start,
                                diagnosis=_http_diagnosis(resp, "generation"))
        msg = _message(resp)
        content = (msg or {}).get("content")
        if not isinstance(content, str) or not content.strip():
            extra = " (a reasoning trace came back: raise max_tokens)" if reasoning_of(msg) else ""
            return check_result("chat", False, "choices[0].message.content is empty%s" % extra,
                                self.clock() - start, diagnosis="generation")
        return check_result("chat", True, "non-empty content (%d chars)" % len(content), self.clock() - start,
                            data={"content_chars": len(content), "usage": (resp.body or {}).get("usage")})

    def check_reasoning(self):
        start = self.clock()
        failed = self._need_model("reasoning", start)
        if failed:
            return failed
        extra = {"chat_template_kwargs": {"thinking_mode": "enabled", "enable_thinking": True}}
        if self.p["engine"] == "sglang":
            extra["separate_reasoning"] = True
        resp = self._chat([{"role": "user", "content": REASONING_PROMPT}], **extra)
        if not resp.ok:
            return check_result("reasoning", False, "chat completion: %s" % resp.describe(), self.clock() - start,
                                diagnosis=_http_diagnosis(resp, "generation"))
        msg = _message(resp) or {}
        content = msg.get("content") if isinstance(msg.get("content"), str) else ""
        trace = reasoning_of(msg)
        leaks = find_reasoning_leaks(content)
        data = {"reasoning_chars": len(trace), "content_chars": len(content), "leaks": leaks,
                "field": "reasoning_content" if msg.get("reasoning_content") else ("reasoning" if msg.get("reasoning") else None)}
        if leaks:
            return check_result("reasoning", False, "reasoning markup leaked into content: %s%s"
                                % (", ".join(leaks), "" if trace else "; no separate reasoning field"),
                                self.clock() - start, diagnosis="reasoning_leak", data=data)
        if not trace:
            return check_result("reasoning", False, "no reasoning trace returned (message.reasoning_content / "
                                "message.reasoning empty)", self.clock() - start, diagnosis="reasoning_leak", data=data)
        if not content.strip():
            return check_result("reasoning", False, "reasoning returned but content is empty",
                                self.clock() - start, diagnosis="generation", data=data)
        return check_result("reasoning", True, "trace in message.%s (%d chars), no markup in content"
                            % (data["field"], len(trace)), self.clock() - start, data=data)

    def _tool_case(self, case):
        messages = [{"role": "user", "content": case["prompt"]}]
        extra = {"tools": TOOLS, "tool_choice": "auto"}
        if len(case["expect"]) > 1:
            extra["parallel_tool_calls"] = True
        resp = self._chat(messages, **extra)
        out = {"case": case["name"], "passed": False}
        if not resp.ok:
            out["error"] = "HTTP %s: %s" % (resp.status, resp.error) if resp.status else resp.describe()
            out["diagnosis"] = _http_diagnosis(resp, "generation")
            if resp.status == 400 and "tool" in (resp.error or "").lower():
                # The server refuses automatic tool choice (vLLM without --enable-auto-tool-choice):
                # ask again without it to see what the model emits into content.
                out["diagnosis"] = "tool_leak"
                probe = self._chat(messages, tools=TOOLS, tool_choice="none")
                pmsg = _message(probe) or {}
                leaks = find_tool_leaks(pmsg.get("content") or "") + find_reasoning_leaks(pmsg.get("content") or "")
                if leaks:
                    out["error"] += "; with tool_choice=none the markup leaks into content: %s" % ", ".join(leaks)
                    out["leaks"] = leaks
            return out
        msg = _message(resp) or {}
        content = msg.get("content") if isinstance(msg.get("content"), str) else ""
        leaks = find_tool_leaks(content)
        if leaks:
            out.update(error="tool-call markup leaked into content: %s" % ", ".join(leaks), leaks=leaks,
                       diagnosis="tool_leak")
            return out
        errors, calls = validate_tool_calls(msg.get("tool_calls"), TOOLS, case["expect"])
        out["calls"] = [c["name"] for c in calls]
        if errors:
            out.update(error="; ".join(errors), diagnosis="tool_leak" if not calls else "generation")
            return out
        out["passed"] = True
        return out

    def check_tools(self):
        start = self.clock()
        failed = self._need_model("tools", start)
        if failed:
            return failed
        cases = [self._tool_case(c) for c in TOOL_CASES]
        bad = [c for c in cases if not c["passed"]]
        if bad:
            detail = "; ".join("%s: %s" % (c["case"], c["error"]) for c in bad)
            return check_result("tools", False, detail, self.clock() - start, diagnosis=bad[0]["diagnosis"],
                                data={"cases": cases})
        return check_result("tools", True, "single, parallel and array/object-argument calls parsed and valid "
                            "(%s)" % ", ".join("%s=%s" % (c["case"], "+".join(c["calls"])) for c in cases),
                            self.clock() - start, data={"cases": cases})

    def check_image(self):
        start = self.clock()
        caps = self.p.get("capabilities")
        if caps is not None and "image" not in caps:
            return check_result("image", True, "skipped: image input is outside this profile's capability "
                                "boundary (%s)" % ", ".join(caps), 0.0, skipped=True)
        failed = self._need_model("image", start)
        if failed:
            return failed
        sources = [("data URI", png_data_uri())]
        url = self.p.get("image_url")
        if url:
            if not url_allowed(url, self.p.get("image_url_allowlist") or []):
                return check_result("image", False, "image_url %s is not in image_url_allowlist; refused before "
                                    "sending" % url, self.clock() - start, diagnosis="image")
            sources.append(("allowlisted URL", url))
        done = []
        for label, src in sources:
            resp = self._chat(image_messages(src))
            if not resp.ok:
                return check_result("image", False, "%s: %s" % (label, resp.describe()), self.clock() - start,
                                    diagnosis=_http_diagnosis(resp, "image"))
            content = (_message(resp) or {}).get("content")
            if not isinstance(content, str) or not content.strip():
                return check_result("image", False, "%s: empty answer" % label, self.clock() - start,
                                    diagnosis="image")
            done.append(label)
        return check_result("image", True, "non-empty answer for %s" % " and ".join(done), self.clock() - start)

    def check_auth(self):
        start = self.clock()
        if not self.p.get("api_key"):
            return check_result("auth", True, "skipped: no API key configured (loopback-only service)", 0.0,
                                skipped=True)
        t = self.timeouts["request"]
        anon = self.client.get("/v1/models", timeout=t, auth=False)
        wrong = self.client.get("/v1/models", timeout=t, key="mm3-verify-deliberately-wrong-key")
        keyed = self.client.get("/v1/models", timeout=t)
        data = {"without_key": anon.status, "wrong_key": wrong.status, "with_key": keyed.status}
        if anon.status is None or keyed.status is None:
            return check_result("auth", False, "no answer: %s" % (anon.error or keyed.error), self.clock() - start,
                                diagnosis="unreachable", data=data)
        problems = []
        if anon.status not in (401, 403):
            problems.append("a request without a key got HTTP %s, expected 401: the server accepts anonymous "
                            "requests" % anon.status)
        if wrong.status not in (401, 403):
            problems.append("a request with a wrong key got HTTP %s, expected 401" % wrong.status)
        if not keyed.ok:
            problems.append("the configured key was rejected (%s)" % keyed.describe())
        if problems:
            return check_result("auth", False, "; ".join(problems), self.clock() - start, diagnosis="auth", data=data)
        return check_result("auth", True, "without key %s, wrong key %s, configured key %s"
                            % (anon.status, wrong.status, keyed.status), self.clock() - start, data=data)

    # ------------------------------------------------------------------ bench
    def _stream_one(self, prompt, max_tokens, timeout):
        payload = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                   "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
        times = []
        usage = {}
        state = []
        errors = []

        def on_line(line, now):
            data = parse_sse_line(line, state)
            if data is None or data.strip() == "[DONE]":
                return
            try:
                event = decode_stream_events([data])
            except ValueError as exc:
                errors.append(str(exc))
                return
            if not event:
                return
            event = event[0]
            if event.get("choices"):
                times.append(now)
            elif event.get("usage"):
                usage.update(event["usage"])
            if event.get("error"):
                errors.append(json.dumps(event["error"])[:200])

        resp, start = self.client.stream("/v1/completions", payload, on_line, timeout=timeout)
        if not resp.ok or errors or not times:
            err = resp.describe() if not resp.ok else (errors[0] if errors else "no tokens streamed")
            return {"ok": False, "error": err, "status": resp.status}
        timing = request_timings(start, times, usage.get("completion_tokens"))
        timing.update(ok=True, input_tokens=usage.get("prompt_tokens"))
        return timing

    def check_bench(self):
        start = self.clock()
        failed = self._need_model("bench", start)
        if failed:
            return failed
        b = dict(self.p["bench"])
        if b.get("seed") is None:
            b["seed"] = random.SystemRandom().randrange(1, 2 ** 31)
        t = self.timeouts["request"]
        # Calibrate words per token with the server's own tokenizer (usage.prompt_tokens).
        probe_words = 200
        cal = self.client.post("/v1/completions", {"model": self.model, "max_tokens": 1,
                                                   "prompt": random_prompt(random.Random(b["seed"] + 1), probe_words)},
                               timeout=t)
        ptoks = ((cal.body or {}).get("usage") or {}).get("prompt_tokens") if cal.ok and isinstance(cal.body, dict) else None
        if not ptoks:
            return check_result("bench", False, "calibration request failed: %s" % cal.describe(),
                                self.clock() - start, diagnosis=_http_diagnosis(cal, "bench"))
        words_per_token = float(probe_words) / ptoks
        prompts = bench_prompts(b["num_prompts"], b["input_len"], words_per_token, seed=b["seed"])
        # One warm-up request (not counted), as vllm bench serve does; its own prompt, so that no
        # measured prompt is already in the server's prefix cache.
        warm_prompt = bench_prompts(1, b["input_len"], words_per_token, seed=b["seed"] + 2)[0]
        warm = self._stream_one(warm_prompt, min(b["output_len"], 16), t)
        if not warm["ok"]:
            return check_result("bench", False, "warm-up request failed: %s" % warm["error"],
                                self.clock() - start, diagnosis=_http_diagnosis(_Status(warm.get("status")), "bench"))
        lock = threading.Lock()
        results = []
        per_request = max(t, self.timeouts["bench"])

        def work(prompt):
            r = self._stream_one(prompt, b["output_len"], per_request)
            with lock:
                results.append(r)

        run_start = time.monotonic()
        with ThreadPoolExecutor(max_workers=b["concurrency"]) as pool:
            list(pool.map(work, prompts))
        duration = time.monotonic() - run_start
        metrics = bench_metrics(results, duration)
        workload = {"input_len": b["input_len"], "output_len": b["output_len"],
                    "concurrency": b["concurrency"], "num_prompts": b["num_prompts"], "seed": b["seed"]}
        reference = b.get("reference") or REFERENCE_FIGURES.get(self.p.get("profile") or "")
        comparison = compare_reference(metrics, reference, workload, b["tolerance"])
        data = {"workload": workload, "words_per_token": words_per_token, "metrics": metrics,
                "reference": comparison}
        if metrics["failed"] or not metrics["completed"]:
            return check_result("bench", False, "%d of %d requests failed: %s" % (
                metrics["failed"], len(prompts), "; ".join(metrics["errors"])), self.clock() - start,
                diagnosis="bench", data=data)
        detail = "%d requests, mean TTFT %.1f ms, mean TPOT %.2f ms, output %.1f tok/s" % (
            metrics["completed"], metrics["ttft_ms"]["mean"], metrics["tpot_ms"]["mean"] or 0.0,
            metrics["output_throughput"] or 0.0)
        if comparison["status"] in ("pass", "warn"):
            detail += "; vs %s: TTFT x%.2f, TPOT x%.2f (%s)" % (
                comparison.get("source") or "reference", comparison["ttft_ms"]["ratio"] or 0,
                comparison["tpot_ms"]["ratio"] or 0, comparison["status"])
        else:
            detail += "; reference comparison skipped: %s" % comparison["reason"]
        return check_result("bench", True, detail, self.clock() - start, data=data,
                            warn=comparison["status"] == "warn")

    def check_eval(self):
        """The site's evaluation set (module_utils/serving_verify_eval.py): every case the
        profile's capabilities allow, passed when passed / run >= pass_threshold."""
        start = self.clock()
        eval_set = self.p.get("eval_set") or {}
        failed = self._need_model("eval", start)
        if failed:
            return failed
        caps = self.p.get("capabilities")
        cases = []
        for case in eval_set["cases"]:
            t0 = self.clock()
            need = case_capability(case)
            if caps is not None and need not in caps:
                cases.append({"case": case["name"], "status": "skipped",
                              "detail": "needs %s, outside this profile's capability boundary" % need})
                continue
            messages, extra = eval_request(case, TOOLS, self.p["engine"])
            resp = self._chat(messages, max_tokens=case.get("max_tokens"), **extra)
            if not resp.ok:
                errors = ["chat completion: %s" % resp.describe()]
            else:
                errors = eval_judge(case, _message(resp), TOOLS)
            cases.append({"case": case["name"], "status": "failed" if errors else "passed",
                          "detail": "; ".join(errors) or "as expected", "seconds": round(self.clock() - t0, 3)})
        ran = [c for c in cases if c["status"] != "skipped"]
        passed = [c for c in ran if c["status"] == "passed"]
        threshold = float(eval_set["pass_threshold"])
        data = {"set": eval_set["name"], "version": eval_set["version"], "threshold": threshold,
                "passed": len(passed), "ran": len(ran), "skipped": len(cases) - len(ran), "cases": cases}
        label = "%s v%s: %d/%d cases passed (threshold %.2f)" % (
            eval_set["name"], eval_set["version"], len(passed), len(ran), threshold)
        if not ran:
            return check_result("eval", False, label + "; no case is inside this profile's capabilities",
                                self.clock() - start, diagnosis="evaluation", data=data)
        bad = [c for c in ran if c["status"] == "failed"]
        ok = len(passed) >= threshold * len(ran) - 1e-9
        detail = label + ("; failed: " + "; ".join("%s: %s" % (c["case"], c["detail"]) for c in bad) if bad else "")
        return check_result("eval", ok, detail, self.clock() - start, data=data,
                            diagnosis=None if ok else "evaluation", warn=ok and bool(bad))

    def run(self, checks):
        """Run the checks in the order given (gateway_rate spends the limits client's budget for
        a minute: list it after the other gateway checks)."""
        results = []
        for name in checks:
            results.append(getattr(self, "check_" + name)())
        return results


class _Status(object):
    def __init__(self, status):
        self.status = status
