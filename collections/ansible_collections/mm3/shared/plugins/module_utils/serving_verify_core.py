# -*- coding: utf-8 -*-
# Pure functions of the serving_verify module: the probe requests, SSE parsing, markup leak
# detection, tool-call validation against a JSON-schema subset, latency statistics, the
# reference comparison and the diagnosis table. Standard library only, no I/O, so the unit
# tests call them directly and the tiny test model (tools/tiny_model) trains on the very
# prompts defined here.
from __future__ import annotations

import base64
import json
import math
import random
import struct
import zlib

# --------------------------------------------------------------------------------------------
# Probe requests (the tiny test model is trained on exactly these; change them together with
# tools/tiny_model and rebuild tests/fixtures/tiny-m3).
# --------------------------------------------------------------------------------------------
CHAT_PROMPT = "Explain sparse attention in one sentence."
REASONING_PROMPT = "What is 17 + 25? Think step by step, then answer."
IMAGE_PROMPT = "Describe this image in one sentence."

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
EVENT_TOOL = {
    "type": "function",
    "function": {
        "name": "create_event",
        "description": "Create a calendar event.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "attendees": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "when": {
                    "type": "object",
                    "properties": {"day": {"type": "string"}, "hour": {"type": "integer"}},
                    "required": ["day", "hour"],
                },
            },
            "required": ["title", "attendees", "when"],
        },
    },
}
TOOLS = [WEATHER_TOOL, EVENT_TOOL]

# name -> (prompt, expected function names in order, minimum number of calls)
TOOL_CASES = [
    {
        "name": "single",
        "prompt": "What is the weather in Paris? Use the tool.",
        "expect": ["get_weather"],
    },
    {
        "name": "parallel",
        "prompt": "What is the weather in Paris and in Tokyo? Call the tool once per city.",
        "expect": ["get_weather", "get_weather"],
    },
    {
        "name": "array_object",
        "prompt": "Create an event called Review with alice and bob on monday at 10.",
        "expect": ["create_event"],
    },
]

# Markup that must never reach `content` when the parsers are on. Order matters: the longest
# MiniMax form first so the report names the most specific marker.
REASONING_MARKERS = ["<mm:think>", "</mm:think>", "<think>", "</think>"]
TOOL_MARKERS = [
    "]<]minimax[>[<tool_call>",
    "]<]minimax[>[",
    "<minimax:tool_call>",
    "<tool_call>",
    "</tool_call>",
]

# Published reference figures (seed "Published performance data"; SGLang, random 2048/256,
# concurrency 64, 128 prompts). Keyed by hardware profile.
REFERENCE_WORKLOAD = {"input_len": 2048, "output_len": 256, "concurrency": 64, "num_prompts": 128}
REFERENCE_FIGURES = {
    "b200": {"ttft_ms": 1580.0, "tpot_ms": 24.1, "source": "8 x B200 MXFP8 TP8 (SGLang, seed)"},
    "h200": {"ttft_ms": 1054.0, "tpot_ms": 70.8, "source": "8 x H200 BF16 TP8 (SGLang, seed)"},
}

# The seed's troubleshooting table, as data: check -> symptom key -> (likely cause, fix).
DIAGNOSES = {
    "unreachable": (
        "the model is still downloading/loading, a worker exited, or port publication is incorrect",
        "inspect the container logs, verify host disk and GPU state, and confirm the port is "
        "published on 127.0.0.1 (e.g. 127.0.0.1:30000:30000)",
    ),
    "not_ready": (
        "the server process is up but cannot generate yet (loading, warm-up) or a worker exited",
        "keep the server running and inspect its logs before sending inference requests; "
        "a 200 from /health alone is not readiness",
    ),
    "auth": (
        "the API key sent does not match the server's --api-key (or the server has no key)",
        "send the key the server was started with as 'Authorization: Bearer <key>' "
        "(serving_api_key) and restart the server with --api-key if it accepts requests without one",
    ),
    "model": (
        "the server serves a different model or revision than expected",
        "confirm the model path and the pinned revision, then restart the server",
    ),
    "reasoning_leak": (
        "the reasoning parser was not enabled or the runtime differs from the pinned image",
        "restore --reasoning-parser auto (SGLang) / --reasoning-parser minimax_m3 (vLLM) and "
        "restart with the pinned digest",
    ),
    "tool_leak": (
        "the tool-call parser was not enabled or the runtime differs from the pinned image",
        "restore --tool-call-parser auto (SGLang) / --enable-auto-tool-choice "
        "--tool-call-parser minimax_m3 (vLLM) and restart with the pinned digest",
    ),
    "image": (
        "the server cannot reach the image URL, the gateway blocks it, or the vision path is "
        "not enabled (Blackwell needs --mm-attention-backend flashinfer_cudnn)",
        "use an allowlisted URL or a validated Base64 data URI; do not disable network "
        "protections globally; check the mm attention backend",
    ),
    "generation": (
        "the server answers but generation fails or returns nothing (worker exited, "
        "out of memory, wrong model)",
        "inspect the server logs; on 'CUDA out of memory' reduce --mem-fraction-static below "
        "0.65, then --chunked-prefill-size to 4096 or 2048, and benchmark again",
    ),
    "gateway": (
        "a gateway protection is missing or was changed (path filter, limits, media policy, TLS)",
        "re-run the gateway role (playbooks/serve.yml) so haproxy.cfg is rendered from gateway_spec; "
        "check the client limits in gateway_clients and the media allowlist",
    ),
    "evaluation": (
        "the model, its revision, the image or a flag answers the site's evaluation set below its "
        "threshold (a regression of this release)",
        "read the failed cases in the report; compare with the release that last passed, and roll "
        "back to it (keep the new release off until the set passes)",
    ),
    "bench": (
        "requests failed under load (out of memory during prefill, timeouts, or a worker exited)",
        "inspect the server logs; reduce --mem-fraction-static / --chunked-prefill-size per the "
        "troubleshooting table, or lower the benchmark concurrency",
    ),
}


def diagnose(key):
    """Return {'cause': ..., 'fix': ...} for a diagnosis key (empty dict if unknown)."""
    if key not in DIAGNOSES:
        return {}
    cause, fix = DIAGNOSES[key]
    return {"cause": cause, "fix": fix}


# --------------------------------------------------------------------------------------------
# SSE
# --------------------------------------------------------------------------------------------
def parse_sse_line(line, state):
    """Feed one line of a text/event-stream; return a complete event's data or None.

    `state` is a list used as the buffer of `data:` lines of the event being read. An event
    ends at an empty line; the returned value is the joined data (may be "[DONE]"). Comment
    lines (":") and other fields (event:, id:, retry:) are ignored.
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.rstrip("\r\n")
    if line == "":
        if not state:
            return None
        data = "\n".join(state)
        del state[:]
        return data
    if line.startswith(":"):
        return None
    field, _, value = line.partition(":")
    if value.startswith(" "):
        value = value[1:]
    if field == "data":
        state.append(value)
    return None


def parse_sse(lines):
    """Yield the data payload of every event in an iterable of lines (bytes or str)."""
    state = []
    for line in lines:
        data = parse_sse_line(line, state)
        if data is not None:
            yield data
    if state:
        yield "\n".join(state)


def decode_stream_events(payloads):
    """Turn SSE payloads into JSON objects; stop at [DONE]. Raises ValueError on bad JSON."""
    events = []
    for payload in payloads:
        if payload.strip() == "[DONE]":
            break
        try:
            events.append(json.loads(payload))
        except ValueError as exc:
            raise ValueError("invalid JSON in stream event: %s (%s)" % (payload[:120], exc))
    return events


# --------------------------------------------------------------------------------------------
# Leaks
# --------------------------------------------------------------------------------------------
def find_markers(text, markers):
    """Return the markers found in text, most specific first, without overlaps reported twice."""
    if not text or not isinstance(text, str):
        return []
    found = []
    for marker in markers:
        if marker in text and not any(marker in f for f in found):
            found.append(marker)
    return found


def find_reasoning_leaks(text):
    return find_markers(text, REASONING_MARKERS)


def find_tool_leaks(text):
    return find_markers(text, TOOL_MARKERS)


def reasoning_of(message):
    """The reasoning trace of a chat message: `reasoning_content` (SGLang, older vLLM) or
    `reasoning` (vLLM); empty string when none."""
    if not isinstance(message, dict):
        return ""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""


# --------------------------------------------------------------------------------------------
# JSON schema subset (type, properties, required, items, enum, minItems, additionalProperties)
# --------------------------------------------------------------------------------------------
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate_schema(value, schema, path="$"):
    """Validate value against a JSON-schema subset; return a list of error strings."""
    errors = []
    if not isinstance(schema, dict):
        return errors
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_TYPES.get(n, lambda v: True)(value) for n in names):
            return ["%s: expected %s, got %s" % (path, "|".join(names), type(value).__name__)]
    if "enum" in schema and value not in schema["enum"]:
        errors.append("%s: %r not one of %r" % (path, value, schema["enum"]))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append("%s: missing required property %r" % (path, key))
        for key, sub in value.items():
            if key in props:
                errors.extend(validate_schema(sub, props[key], "%s.%s" % (path, key)))
            elif schema.get("additionalProperties") is False:
                errors.append("%s: unexpected property %r" % (path, key))
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append("%s: fewer than %d items" % (path, schema["minItems"]))
        if "items" in schema:
            for i, item in enumerate(value):
                errors.extend(validate_schema(item, schema["items"], "%s[%d]" % (path, i)))
    return errors


def validate_tool_calls(tool_calls, tools, expect):
    """Check parsed tool calls against the offered tools and the expected function names.

    Returns (errors, calls) where calls is [{'name':..., 'arguments': <parsed>}].
    """
    errors = []
    calls = []
    schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    if not isinstance(tool_calls, list) or not tool_calls:
        return ["no tool_calls in the response"], calls
    for i, call in enumerate(tool_calls):
        fn = (call or {}).get("function") or {}
        name = fn.get("name")
        raw = fn.get("arguments")
        if name not in schemas:
            errors.append("call %d: unknown function %r" % (i, name))
            continue
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            errors.append("call %d (%s): arguments are not valid JSON: %s" % (i, name, exc))
            continue
        calls.append({"name": name, "arguments": args})
        for err in validate_schema(args, schemas[name]):
            errors.append("call %d (%s): %s" % (i, name, err))
    names = sorted(c["name"] for c in calls)
    if not errors and names != sorted(expect):
        errors.append("expected calls %s, got %s" % (sorted(expect), names))
    return errors, calls


# --------------------------------------------------------------------------------------------
# Statistics and the benchmark
# --------------------------------------------------------------------------------------------
def percentile(values, pct):
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(math.floor(rank))
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def summarize(values, scale=1.0):
    """mean / median / p99 (and count) of values multiplied by scale (e.g. 1000 for ms)."""
    vals = [v * scale for v in values if v is not None]
    if not vals:
        return {"mean": None, "median": None, "p99": None, "count": 0}
    return {
        "mean": sum(vals) / len(vals),
        "median": percentile(vals, 50),
        "p99": percentile(vals, 99),
        "count": len(vals),
    }


def request_timings(start, chunk_times, output_tokens=None):
    """Timings of one streamed request from the arrival times of its content chunks.

    TTFT = first chunk - start; ITL = gaps between chunks; latency = last chunk - start;
    TPOT = (latency - TTFT) / (output tokens - 1), as vLLM's and SGLang's benchmarks define
    it. output_tokens defaults to the number of chunks when the server sent no usage.
    """
    if not chunk_times:
        return {"ttft": None, "itl": [], "latency": None, "tpot": None, "output_tokens": 0}
    tokens = output_tokens if output_tokens else len(chunk_times)
    ttft = chunk_times[0] - start
    latency = chunk_times[-1] - start
    itl = [b - a for a, b in zip(chunk_times, chunk_times[1:])]
    tpot = (latency - ttft) / (tokens - 1) if tokens > 1 else None
    return {"ttft": ttft, "itl": itl, "latency": latency, "tpot": tpot, "output_tokens": tokens}


def bench_metrics(requests, duration):
    """Aggregate per-request results into the benchmark's report.

    requests: [{'ok': bool, 'ttft', 'itl', 'latency', 'tpot', 'output_tokens',
                'input_tokens', 'error'}]; duration in seconds (wall clock of the run).
    Times are reported in milliseconds, throughput in tokens (or requests) per second.
    """
    ok = [r for r in requests if r.get("ok")]
    failed = [r for r in requests if not r.get("ok")]
    out_tokens = sum(r.get("output_tokens") or 0 for r in ok)
    in_tokens = sum(r.get("input_tokens") or 0 for r in ok)
    itl = [v for r in ok for v in (r.get("itl") or [])]
    dur = duration if duration and duration > 0 else None
    return {
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted(set(str(r.get("error")) for r in failed))[:5],
        "duration_s": duration,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput": (len(ok) / dur) if dur else None,
        "output_throughput": (out_tokens / dur) if dur else None,
        "total_token_throughput": ((in_tokens + out_tokens) / dur) if dur else None,
        "ttft_ms": summarize([r.get("ttft") for r in ok], 1000.0),
        "tpot_ms": summarize([r.get("tpot") for r in ok], 1000.0),
        "itl_ms": summarize(itl, 1000.0),
        "e2el_ms": summarize([r.get("latency") for r in ok], 1000.0),
    }


def compare_reference(metrics, reference, workload, tolerance=0.10):
    """Compare mean TTFT/TPOT with a reference; ratio = measured / reference.

    status: 'pass' when every ratio <= 1 + tolerance, 'warn' otherwise, 'skipped' when there is
    no reference or the workload differs from the one the reference was measured with.
    """
    if not reference:
        return {"status": "skipped", "reason": "no published reference for this profile"}
    differs = {k: (workload.get(k), v) for k, v in REFERENCE_WORKLOAD.items() if workload.get(k) != v}
    if differs:
        return {
            "status": "skipped",
            "reason": "workload differs from the reference's (%s)"
            % ", ".join("%s %s != %s" % (k, a, b) for k, (a, b) in sorted(differs.items())),
        }
    result = {"status": "pass", "tolerance": tolerance, "source": reference.get("source", "")}
    for key in ("ttft_ms", "tpot_ms"):
        measured = (metrics.get(key) or {}).get("mean")
        ref = reference.get(key)
        if measured is None or not ref:
            result[key] = {"measured": measured, "reference": ref, "ratio": None}
            result["status"] = "warn"
            continue
        ratio = measured / float(ref)
        result[key] = {"measured": measured, "reference": float(ref), "ratio": ratio}
        if ratio > 1.0 + tolerance:
            result["status"] = "warn"
    return result


# A fixed word list: prompts are made of these words, seeded, so a run is reproducible. The
# server's usage.prompt_tokens calibrates words per token (no tokenizer on the node).
WORDS = (
    "the of and to in is that for it as with was on be by this are from or at an which "
    "model token server request weight expert memory cache layer attention sparse vision "
    "image text reason tool call parallel array object value number result answer check "
    "health ready stream latency throughput node cluster network storage disk digest "
    "revision license deploy verify report bench random prompt output input length mean "
    "median percentile river mountain ocean forest city north south east west red green blue"
).split()


def random_prompt(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_words)))


def bench_prompts(num_prompts, input_len, words_per_token, seed=0):
    """num_prompts prompts of about input_len tokens each (words_per_token from calibration)."""
    rng = random.Random(seed)
    n_words = max(1, int(round(input_len * words_per_token)))
    return [random_prompt(rng, n_words) for _ in range(num_prompts)]


# --------------------------------------------------------------------------------------------
# Image
# --------------------------------------------------------------------------------------------
def make_png(width=64, height=64):
    """A small RGB PNG (a red square on a blue background), built with zlib only."""
    rows = []
    for y in range(height):
        row = bytearray([0])  # filter type none
        for x in range(width):
            inside = width // 4 <= x < 3 * width // 4 and height // 4 <= y < 3 * height // 4
            row.extend((220, 30, 30) if inside else (30, 60, 200))
        rows.append(bytes(row))
    raw = b"".join(rows)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def png_data_uri(png=None):
    return "data:image/png;base64," + base64.b64encode(png or make_png()).decode("ascii")


def image_messages(url):
    return [{
        "role": "user",
        "content": [
            {"type": "text", "text": IMAGE_PROMPT},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }]


def url_allowed(url, allowlist):
    """True when url starts with one of the allowlisted prefixes (scheme://host[/path])."""
    if not url or not allowlist:
        return False
    for prefix in allowlist:
        p = prefix.rstrip("/")
        if url == p or url.startswith(p + "/") or url.startswith(p + "?"):
            return True
    return False


# --------------------------------------------------------------------------------------------
# Result helpers
# --------------------------------------------------------------------------------------------
def check_result(name, passed, detail, seconds, skipped=False, diagnosis=None, data=None, warn=False):
    result = {
        "name": name,
        "passed": bool(passed),
        "skipped": bool(skipped),
        "status": "skipped" if skipped else ("failed" if not passed else ("warn" if warn else "passed")),
        "detail": detail,
        "seconds": round(seconds, 3),
    }
    if diagnosis and not passed:
        result.update(diagnose(diagnosis))
    if data is not None:
        result["data"] = data
    return result


def failure_message(results):
    """One message naming every failed check with its likely cause and fix."""
    parts = []
    for r in results:
        if r.get("status") != "failed":
            continue
        text = "%s: %s" % (r["name"], r.get("detail"))
        if r.get("cause"):
            text += " -- likely cause: %s; fix: %s" % (r["cause"], r["fix"])
        parts.append(text)
    return "verification failed: " + " | ".join(parts) if parts else ""
