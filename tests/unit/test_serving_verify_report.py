"""Unit tests of filter_plugins/serving_verify_report.py: the controller-side summary and JUnit
XML rendered from the serving_verify results of every node (pure functions)."""

from __future__ import annotations

import importlib.util
import os
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("serving_verify_report",
                                               os.path.join(ROOT, "filter_plugins", "serving_verify_report.py"))
rep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rep)


def _result(name, status, detail="d", seconds=0.5, **extra):
    r = {"name": name, "status": status, "passed": status != "failed", "skipped": status == "skipped",
         "detail": detail, "seconds": seconds}
    r.update(extra)
    return r


def _report(results):
    counts = {"passed": 0, "failed": 0, "skipped": 0, "warn": 0}
    for r in results:
        counts[r["status"]] += 1
    counts["total"] = len(results)
    return {"base_url": "http://127.0.0.1:30000", "engine": "sglang", "model": "m", "summary": counts,
            "results": results}


GOOD = {"changed": False, "report": _report([_result("health", "passed"), _result("image", "skipped", "skipped: boundary"),
                                             _result("bench", "warn", "TTFT x1.2 <slow> & co")])}
BAD = {"failed": True, "msg": "verification failed", "report": _report([
    _result("health", "passed"),
    _result("reasoning", "failed", "reasoning markup leaked into content: <think>", cause="parser off",
            fix="restore --reasoning-parser auto")])}


def test_reports_from_registered_results():
    reports = rep.serving_verify_reports({"n2": BAD, "n1": GOOD, "n3": {}, "n4": {"failed": True, "msg": "bad options"}})
    assert list(reports) == ["n1", "n2", "n3", "n4"]
    assert reports["n1"]["model"] == "m"
    assert "unreachable" in reports["n3"]["error"]
    assert reports["n4"]["error"] == "bad options"
    assert rep.serving_verify_failed_hosts(reports) == ["n2", "n3", "n4"]


def test_summary_text():
    text = rep.serving_verify_summary(rep.serving_verify_reports({"n1": GOOD, "n2": BAD}))
    lines = text.splitlines()
    assert lines[0] == "n1: http://127.0.0.1:30000 (sglang, model m): 1 passed, 0 failed, 1 skipped, 1 warn"
    assert any(line.strip().startswith("FAILED  reasoning") and "<think>" in line for line in lines)
    assert "          fix: restore --reasoning-parser auto" in lines
    assert lines[-1] == "VERDICT: FAILED on n2"
    ok = rep.serving_verify_summary({"n1": GOOD})
    assert ok.endswith("VERDICT: PASSED on 1 node(s)\n")
    assert rep.serving_verify_summary({}).strip() == "no serving node reported"


def test_junit_xml_parses_and_counts():
    xml = rep.serving_verify_junit(rep.serving_verify_reports({"n1": GOOD, "n2": BAD, "n3": {}}))
    root = ET.fromstring(xml.encode())
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("6", "1", "1", "1")
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"serving_verify.n1", "serving_verify.n2", "serving_verify.n3"}
    failure = suites["serving_verify.n2"].find("testcase[@name='reasoning']/failure")
    assert "<think>" in failure.get("message") and "restore --reasoning-parser auto" in failure.text
    assert suites["serving_verify.n1"].find("testcase[@name='image']/skipped") is not None
    assert "<slow> & co" in suites["serving_verify.n1"].find("testcase[@name='bench']/system-out").text
    assert suites["serving_verify.n3"].find("testcase/error") is not None


def test_filters_are_registered():
    names = set(rep.FilterModule().filters())
    assert names == {"serving_verify_reports", "serving_verify_summary", "serving_verify_junit",
                     "serving_verify_failed_hosts"}
