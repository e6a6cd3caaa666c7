# -*- coding: utf-8 -*-
"""The evaluation set of the serving_verify module (check C(eval)): a small versioned file of
prompts with machine-checkable expectations, run on every model or configuration change (the
article, section 7), passed when the share of cases that pass reaches the set's threshold.

A set (YAML, evals/*.yml; the module receives it parsed):

    version: 1
    name: minimax-m3-core          # [a-z0-9._-]
    pass_threshold: 1.0            # share of the cases that run (not skipped) that must pass
    cases:
      - name: weather-tool
        prompt: What is the weather in Paris? Use the tool.
        expect:
          tool_calls: [get_weather]        # valid calls against the offered tools' schemas
      - name: arithmetic
        prompt: What is 17 + 25? Think step by step, then answer.
        expect:
          reasoning: true                  # a separate trace, no markup in content
          contains: ["42"]                 # every string, in content
          not_contains: ["<think>"]        # none of them, in content
      - name: json-answer
        prompt: Answer with a JSON object with a key "city" holding "Paris" and nothing else.
        expect:
          json: {type: object, required: [city]}   # or json: true (it parses)
      - name: describe-image
        image: true                        # the module's built-in PNG as a data URI
        prompt: Describe this image in one sentence.
        expect: {non_empty: true}

Optional per case: `capability` (default from the expectations: image, tools, reasoning or
text; a case outside the profile's boundary is skipped with that reason), `tools` (OpenAI
tool definitions; default the module's weather/event tools), `max_tokens`, `ignore_case`
(default true for contains/not_contains).

Pure functions: eval_problems (the set's refusals, each naming the fix), eval_request (what a
case sends), eval_judge (what a case's answer must satisfy). The module's Verifier.check_eval
wires them to the server.
"""
from __future__ import annotations

import json
import re

from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_core import (
    find_reasoning_leaks, find_tool_leaks, image_messages, png_data_uri, reasoning_of, validate_schema,
    validate_tool_calls)

EXPECT_KEYS = ("contains", "not_contains", "reasoning", "tool_calls", "json", "non_empty")
CASE_KEYS = ("name", "prompt", "expect", "capability", "tools", "image", "max_tokens", "ignore_case")
CAPABILITIES = ("text", "reasoning", "tools", "image")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def _strings(value):
    return isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)


def eval_problems(eval_set):
    """Every reason the set cannot run, naming the fix; empty when it can."""
    if not isinstance(eval_set, dict):
        return ["the evaluation set is a %s, not a mapping with version, name, pass_threshold and "
                "cases: see evals/minimax-m3.yml." % type(eval_set).__name__]
    problems = []
    if eval_set.get("version") != 1:
        problems.append("evaluation set version is %r: this module reads version 1." % eval_set.get("version"))
    if not isinstance(eval_set.get("name"), str) or not _NAME.match(eval_set["name"]):
        problems.append("evaluation set name %r: use [a-z0-9._-], at most 64 characters." % eval_set.get("name"))
    threshold = eval_set.get("pass_threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        problems.append("pass_threshold is %r: set the share of cases that must pass, in (0, 1] "
                        "(1.0: every case)." % (threshold,))
    cases = eval_set.get("cases")
    if not isinstance(cases, list) or not cases:
        return problems + ["the evaluation set has no cases: list at least one under `cases`."]
    seen = set()
    for index, case in enumerate(cases):
        where = "case %d" % index
        if not isinstance(case, dict):
            problems.append("%s is a %s: write it as a mapping with name, prompt, expect." % (where, type(case).__name__))
            continue
        name = case.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append("%s: name %r, use [a-z0-9._-]." % (where, name))
        elif name in seen:
            problems.append("case %s is listed twice: give each case its own name." % name)
        else:
            where = "case %s" % name
            seen.add(name)
        unknown = sorted(set(case) - set(CASE_KEYS))
        if unknown:
            problems.append("%s: unknown keys %s (known: %s)." % (where, ", ".join(unknown), ", ".join(CASE_KEYS)))
        prompt = case.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip() or _CONTROL.search(prompt):
            problems.append("%s: prompt must be non-empty text without control characters." % where)
        expect = case.get("expect")
        if not isinstance(expect, dict) or not expect:
            problems.append("%s: expect is empty: give at least one of %s." % (where, ", ".join(EXPECT_KEYS)))
            continue
        unknown = sorted(set(expect) - set(EXPECT_KEYS))
        if unknown:
            problems.append("%s: unknown expectations %s (known: %s)." % (where, ", ".join(unknown), ", ".join(EXPECT_KEYS)))
        for key in ("contains", "not_contains", "tool_calls"):
            if key in expect and not _strings(expect[key]):
                problems.append("%s: expect.%s must be a non-empty list of strings." % (where, key))
        for key in ("reasoning", "non_empty"):
            if key in expect and expect[key] is not True:
                problems.append("%s: expect.%s can only be true (leave it out otherwise)." % (where, key))
        if "json" in expect and expect["json"] is not True and not isinstance(expect["json"], dict):
            problems.append("%s: expect.json is true (the answer parses) or a JSON schema." % where)
        if case.get("capability") is not None and case["capability"] not in CAPABILITIES:
            problems.append("%s: capability %r, use one of %s." % (where, case["capability"], ", ".join(CAPABILITIES)))
        if case.get("tools") is not None and (not isinstance(case["tools"], list) or not all(
                isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name")
                for t in case["tools"])):
            problems.append("%s: tools must list OpenAI tool definitions ({type: function, function: "
                            "{name, parameters}})." % where)
        mt = case.get("max_tokens")
        if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= 32768):
            problems.append("%s: max_tokens %r, set an integer from 1 to 32768." % (where, mt))
        for key in ("image", "ignore_case"):
            if key in case and not isinstance(case[key], bool):
                problems.append("%s: %s must be true or false." % (where, key))
    return problems


def case_capability(case):
    """The capability a case needs: its own, else image > tools > reasoning > text."""
    if case.get("capability"):
        return case["capability"]
    expect = case.get("expect") or {}
    if case.get("image"):
        return "image"
    if expect.get("tool_calls"):
        return "tools"
    if expect.get("reasoning"):
        return "reasoning"
    return "text"


def eval_request(case, default_tools, engine):
    """(messages, extra request fields) of a case."""
    if case.get("image"):
        messages = image_messages(png_data_uri())
        messages[0]["content"][0]["text"] = case["prompt"]
    else:
        messages = [{"role": "user", "content": case["prompt"]}]
    extra = {}
    expect = case["expect"]
    if expect.get("tool_calls"):
        extra.update(tools=case.get("tools") or default_tools, tool_choice="auto")
        if len(expect["tool_calls"]) > 1:
            extra["parallel_tool_calls"] = True
    if expect.get("reasoning"):
        extra["chat_template_kwargs"] = {"thinking_mode": "enabled", "enable_thinking": True}
        if engine == "sglang":
            extra["separate_reasoning"] = True
    return messages, extra


def eval_judge(case, message, default_tools):
    """The errors of one answer (choices[0].message) against the case's expectations; empty
    when it passes."""
    expect = case["expect"]
    message = message or {}
    content = message.get("content") if isinstance(message.get("content"), str) else ""
    fold = (lambda s: s.lower()) if case.get("ignore_case", True) else (lambda s: s)
    errors = []
    for needle in expect.get("contains") or []:
        if fold(needle) not in fold(content):
            errors.append("content does not contain %r" % needle)
    for needle in expect.get("not_contains") or []:
        if fold(needle) in fold(content):
            errors.append("content contains %r" % needle)
    if expect.get("reasoning"):
        leaks = find_reasoning_leaks(content)
        if leaks:
            errors.append("reasoning markup in content: %s" % ", ".join(leaks))
        elif not reasoning_of(message):
            errors.append("no separate reasoning trace")
    if expect.get("tool_calls"):
        leaks = find_tool_leaks(content)
        if leaks:
            errors.append("tool-call markup in content: %s" % ", ".join(leaks))
        else:
            call_errors, _ = validate_tool_calls(message.get("tool_calls"), case.get("tools") or default_tools,
                                                 expect["tool_calls"])
            errors += call_errors
    if "json" in expect:
        text = content.strip()
        fenced = _FENCE.match(text)
        try:
            value = json.loads(fenced.group(1) if fenced else text)
        except ValueError as exc:
            errors.append("content is not JSON (%s): %r" % (exc, text[:80]))
        else:
            if isinstance(expect["json"], dict):
                errors += ["JSON answer: %s" % e for e in validate_schema(value, expect["json"])]
    if expect.get("non_empty") and not content.strip():
        errors.append("content is empty")
    return errors
