# -*- coding: utf-8 -*-
"""Filters of the `gpu_burnin` role: read what DCGM's `dcgmi diag` and nccl-tests'
`all_reduce_perf` print, and judge a node against its GPU type's threshold. Pure functions;
tests/unit/test_gpu_burnin.py replays recorded outputs (tests/fixtures/burnin, public sources)."""
from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError
from ansible_collections.mm3.shared.plugins.module_utils import validation as v

# nccl-tests prints one row per message size: size count type redop [root] then, out of place and
# in place, time algbw busbw #wrong (the root column arrived in nccl-tests 2.10; #wrong is "N/A"
# with -c 0 and a float error in releases before 2.0).
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(?:-?\d+\s+)?"
                  r"(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+.*?device\s+(\d+)\s+\[([0-9a-fA-Fx:.]+)\]\s+(.+?)\s*$")


def _float(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value == value else None


def _wrong(text):
    """#wrong as a count (None: not validated, N/A). Old releases print an error such as 0e+00."""
    if text in ("N/A", "-"):
        return None
    value = _float(text)
    return None if value is None else (0 if value == 0 else max(int(value), 1))


def allreduce(text):
    """What `all_reduce_perf` printed: {gpus (nGpus x nThread x processes, from the rank lines
    when there are any), devices: [{rank, device, bus, name}], rows: [{bytes, busbw_oop, busbw_ip,
    wrong}], peak_bytes: the largest size measured, peak_busbw: the lower of its out-of-place and
    in-place bus bandwidth (GB/s), avg_busbw: the tool's "Avg bus bandwidth", wrong: rows whose
    results were wrong, out_of_bounds: the tool's count (None when it printed none)}."""
    text = str(text or "")
    devices = []
    rows = []
    header = re.search(r"nThread\s+(\d+)\s+nGpus\s+(\d+)", text)
    for line in text.splitlines():
        rank = _RANK.match(line)
        if rank:
            devices.append({"rank": int(rank.group(1)), "device": int(rank.group(2)),
                            "bus": rank.group(3).lower(), "name": rank.group(4)})
            continue
        if line.lstrip().startswith("#"):
            continue
        row = _ROW.match(line)
        if row:
            rows.append({"bytes": int(row.group(1)), "busbw_oop": _float(row.group(7)), "wrong_oop": _wrong(row.group(8)),
                         "busbw_ip": _float(row.group(11)), "wrong_ip": _wrong(row.group(12))})
    gpus = len(devices) if devices else (int(header.group(1)) * int(header.group(2)) if header else 0)
    peak = max(rows, key=lambda r: r["bytes"]) if rows else None
    peak_busbw = None
    if peak is not None:
        both = [b for b in (peak["busbw_oop"], peak["busbw_ip"]) if b is not None]
        peak_busbw = min(both) if both else None
    avg = re.search(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)", text, re.M)
    bounds = re.search(r"^#\s*Out of bounds values\s*:\s*(\d+)", text, re.M)
    return {
        "gpus": gpus, "devices": devices, "rows": len(rows),
        "peak_bytes": peak["bytes"] if peak else None, "peak_busbw": peak_busbw,
        "avg_busbw": _float(avg.group(1)) if avg else None,
        "wrong": [r["bytes"] for r in rows if (r["wrong_oop"] or 0) > 0 or (r["wrong_ip"] or 0) > 0],
        "out_of_bounds": int(bounds.group(1)) if bounds else None,
    }


# dcgmi diag prints a table of "| name | result |" rows grouped under "-----  Deployment  -----"
# style headings. DCGM 3 writes "Pass", "Fail - GPU: 0, 3", "Fail - All", "Skip - All"; DCGM 4
# writes "Pass"/"Fail"/"Warn" with a "GPU0: Fail" row per GPU under it. Both write "Warning",
# "Error" or "Info" rows after a test, their text wrapped onto rows with an empty first cell.
_CELLS = re.compile(r"^\s*\|\s?(.*?)\s*\|(.*)\|\s*$")
_RESULT = re.compile(r"^(Pass|Fail|Skip|Warn|Not Run|Not run)\b(.*)$")
_NOTE = re.compile(r"^(Warning|Error|Info)\b:?\s*(.*)$")


def _result_gpus(rest):
    """The GPUs a DCGM 3 result names ("- GPU: 0, 3" -> [0, 3]; "- All" -> "all"; none -> [])."""
    if re.match(r"^\s*-\s*All\b", rest):
        return "all"
    named = re.match(r"^\s*-\s*GPU[s]?\s*:?\s*([\d,\s]+)", rest)
    return [int(g) for g in re.findall(r"\d+", named.group(1))] if named else []


def dcgm(text):
    """What `dcgmi diag -r N` printed: {ran: the "Successfully ran diagnostic" line was there,
    version: DCGM's version, tests: [{name, section, result, gpus: the GPUs whose result is Fail
    ("all" for every one), messages: its Warning/Error text}], failed: the tests whose result is
    Fail, ran_beyond_deployment: the names of the tests past the Deployment checks that ran (not
    skipped)}."""
    text = str(text or "")
    tests, section, current, note = [], None, None, None
    for line in text.splitlines():
        heading = re.match(r"^\s*[|+]-+\s+(\w[\w ]*?)\s+-+", line)
        if heading:
            section, current, note = heading.group(1), None, None
            continue
        cells = _CELLS.match(line)
        if not cells or set(line.strip()) <= set("+-=|"):
            continue
        # the result cell is " <text padded to its width>  ": wrapped text keeps its own spaces
        name, raw = cells.group(1), cells.group(2)
        piece, value = raw[1:-2] if len(raw) > 3 else raw.strip(), raw.strip()
        if name == "Diagnostic" and value == "Result":
            continue
        kind = _NOTE.match(name)
        if kind:
            note = kind.group(1)
            if current is not None and note in ("Warning", "Error"):
                current["messages"].append(" ".join(x for x in (kind.group(2), piece) if x))
            continue
        if not name:
            per_gpu = re.match(r"^GPU\s?(\d+):\s*(\w+)", value)
            if per_gpu and current is not None:
                note = None
                if per_gpu.group(2) == "Fail" and isinstance(current["gpus"], list) \
                        and int(per_gpu.group(1)) not in current["gpus"]:
                    current["gpus"].append(int(per_gpu.group(1)))
            elif current is not None and note in ("Warning", "Error") and current["messages"]:
                # DCGM wraps mid-word at the cell's width: the pieces join as they are
                current["messages"][-1] += piece
            continue
        note = None
        result = _RESULT.match(value)
        if section in (None, "Metadata") or not result:
            current = None
            continue
        current = {"name": name, "section": section, "result": result.group(1),
                   "gpus": _result_gpus(result.group(2)) if result.group(1) == "Fail" else [], "messages": []}
        tests.append(current)
    for test in tests:
        test["messages"] = [" ".join(m.split()) for m in test["messages"]]
    version = re.search(r"DCGM Version\s*\|\s*(\S+)", text)
    return {"ran": "Successfully ran diagnostic" in text, "version": version.group(1) if version else None,
            "tests": tests, "failed": [t for t in tests if t["result"] == "Fail"],
            "ran_beyond_deployment": [t["name"] for t in tests
                                      if t["section"] != "Deployment" and t["result"] in ("Pass", "Fail", "Warn")]}


def input_problems(level, allreduce_on, image, command, timeout_s, vendor):
    """Every burn-in setting that cannot work, as sentences naming the variable and the fix ([]
    when none): the DCGM level 1-4, a pinned nccl-tests image (repository@sha256:<digest>) unless
    another command is given, a command as a list of plain strings, a timeout of 60 s to a day, and
    an NVIDIA profile (DCGM and NCCL test NVIDIA GPUs only)."""
    problems = []
    if vendor != "nvidia":
        problems.append("gpu_burnin tests NVIDIA GPUs (DCGM, NCCL); this profile's GPUs are %s: leave the burn-in "
                        "out for it (prepare_burnin: false)" % (vendor,))
    if v.whole_number(level, 1, 4) is None:
        problems.append("gpu_burnin_dcgm_level must be 1, 2, 3 or 4 (dcgmi diag -r), not %r (%s)"
                        % (level, v.type_name(level)))
    if v.whole_number(timeout_s, 60, 86400) is None:
        problems.append("gpu_burnin_timeout_s must be a whole number of seconds from 60 to 86400, not %r (%s)"
                        % (timeout_s, v.type_name(timeout_s)))
    if not isinstance(command, list) or not all(isinstance(x, str) and x for x in command):
        problems.append("gpu_burnin_allreduce_command must be a list of non-empty strings (an argv), not %r (%s)"
                        % (command, v.type_name(command)))
    else:
        problems += v.control_problems(command, "gpu_burnin_allreduce_command")
    if allreduce_on is True and not command and not v.is_digest_reference(image):
        problems.append("gpu_burnin_allreduce_image is %r: set it to the nccl-tests image loaded on the node, pinned "
                        "by digest (repository@sha256:<64 hex>), or set gpu_burnin_allreduce: false"
                        % (image,))
    return problems


def threshold(entry, override=None):
    """The all-reduce floor (GB/s of bus bandwidth at the largest size) a node must reach: the
    site's override (gpu_burnin_allreduce_min_busbw_gbps) or the matrix's figure for the profile's
    GPU type (serving_spec.gpu.burnin). Returns {min_busbw, reference, source}; min_busbw None when
    neither names one."""
    if override is not None and override != "":
        value = v.number(override, 1, 100000)
        if value is None:
            raise AnsibleFilterError(
                "gpu_burnin_allreduce_min_busbw_gbps must be a number of GB/s between 1 and 100000, not %r (%s): "
                "set it to the bus bandwidth this node must reach, or leave it unset for the matrix's figure."
                % (override, v.type_name(override)))
        return {"min_busbw": value, "reference": None, "source": "gpu_burnin_allreduce_min_busbw_gbps (site)"}
    entry = entry if isinstance(entry, dict) else {}
    return {"min_busbw": entry.get("min_busbw_gbps"), "reference": entry.get("reference_busbw_gbps"),
            "source": entry.get("source")}


def verdict(allreduce_result, dcgm_result, gpu_count, floor, level=None, timeout_s=None, timed_out=None):
    """Judge a node: {status: pass or fail, problems: [sentences naming the measured number, the
    threshold and the failing GPU or test]}. allreduce_result/dcgm_result: allreduce()/dcgm()
    (None: that part was not run); floor: threshold(); timed_out: the tests `timeout` stopped."""
    problems = ["a test was stopped after gpu_burnin_timeout_s (%s s): %s; a healthy node finishes well within it, "
                "give it more only after reading the test's output" % (timeout_s, ", ".join(str(t) for t in timed_out))
                ] if timed_out else []
    if dcgm_result is not None:
        if not dcgm_result.get("ran"):
            problems.append("dcgmi diag%s did not complete (no \"Successfully ran diagnostic\"): read its output above; "
                            "start nvidia-dcgm (systemctl start nvidia-dcgm) or install datacenter-gpu-manager"
                            % (" -r %s" % level if level else ""))
        for test in dcgm_result.get("failed", []):
            gpus = "every GPU" if test["gpus"] == "all" else (
                ", ".join("GPU %s" % g for g in test["gpus"]) or "the node")
            said = test["messages"]
            problems.append("dcgmi diag%s: %s (%s) failed on %s%s" % (
                " -r %s" % level if level else "", test["name"], test["section"], gpus,
                (": " + said[0][:240] + (" (and %d more messages)" % (len(said) - 1) if len(said) > 1 else ""))
                if said else ""))
        if dcgm_result.get("ran") and v.whole_number(level, 2, 4) and not dcgm_result.get("ran_beyond_deployment"):
            problems.append("dcgmi diag -r %s ran no test beyond the deployment checks (every one skipped): "
                            "the hardware was not tested; read dcgmi's output and nv-hostengine's log "
                            "(/var/log/nv-hostengine.log) for why" % level)
    if allreduce_result is not None:
        if allreduce_result.get("rows", 0) == 0:
            problems.append("all_reduce_perf printed no result rows: read its output above (the image, "
                            "--gpus all and --ipc=host are needed)")
        else:
            if gpu_count and allreduce_result.get("gpus") != gpu_count:
                problems.append("all_reduce_perf ran on %s GPUs, the profile has %s: every GPU must take part"
                                % (allreduce_result.get("gpus"), gpu_count))
            if allreduce_result.get("wrong"):
                problems.append("all_reduce_perf returned wrong results at %s bytes: a GPU or link corrupts data; "
                                "run dcgmi diag -r 3 and nvidia-smi nvlink -s to find it"
                                % ", ".join(str(b) for b in allreduce_result["wrong"][:4]))
            if allreduce_result.get("out_of_bounds"):
                problems.append("all_reduce_perf counted %s out-of-bounds values" % allreduce_result["out_of_bounds"])
            busbw, need = allreduce_result.get("peak_busbw"), (floor or {}).get("min_busbw")
            if need is None:
                problems.append("no all-reduce threshold for this GPU type: add gpu.burnin to the profile's matrix entry "
                                "(with its source) or set gpu_burnin_allreduce_min_busbw_gbps")
            elif busbw is None or busbw < float(need):
                problems.append("all-reduce bus bandwidth %s GB/s at %s bytes across %s GPUs is below the %s GB/s "
                                "threshold (%s): check the NVLink state (nvidia-smi nvlink -s, nvidia-smi -q "
                                "Fabric) and that no GPU is throttled (nvidia-smi -q -d PERFORMANCE)"
                                % (busbw, allreduce_result.get("peak_bytes"), allreduce_result.get("gpus"), need,
                                   floor.get("source")))
    return {"status": "fail" if problems else "pass", "problems": problems}


class FilterModule(object):
    """gpu_burnin_allreduce, gpu_burnin_dcgm, gpu_burnin_threshold, gpu_burnin_verdict,
    gpu_burnin_input_problems."""

    def filters(self):
        return {"gpu_burnin_allreduce": allreduce, "gpu_burnin_dcgm": dcgm,
                "gpu_burnin_threshold": threshold, "gpu_burnin_verdict": verdict,
                "gpu_burnin_input_problems": input_problems}
