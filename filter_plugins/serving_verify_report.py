# -*- coding: utf-8 -*-
# Filters that turn the serving_verify results of every node into the controller's short human
# summary and a JUnit XML file (playbooks/verify.yml). Pure functions: unit-tested in
# tests/unit/test_serving_verify_report.py.
from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

DOCUMENTATION_FILTERS = {
    "serving_verify_reports": "host -> registered result  =>  host -> report",
    "serving_verify_summary": "host -> report  =>  text",
    "serving_verify_junit": "host -> report  =>  JUnit XML",
    "serving_verify_failed_hosts": "host -> report  =>  sorted hosts with a failed check or no report",
}


def _report_of(result):
    """The report of one host from its registered module result (or a report itself)."""
    if not isinstance(result, dict) or not result:
        return {"error": "no result: the host was unreachable or the task did not run", "results": []}
    if "results" in result and "summary" in result and "base_url" in result and "report" not in result:
        return result  # already a report
    report = result.get("report")
    if isinstance(report, dict):
        return report
    # The module failed before producing a report (bad options, interpreter missing, ...).
    return {"error": result.get("msg") or "the module returned no report", "results": result.get("results") or []}


def serving_verify_reports(results):
    """{host: registered result} -> {host: report}."""
    return {host: _report_of(res) for host, res in sorted((results or {}).items())}


def _host_failed(report):
    if report.get("error"):
        return True
    return any(r.get("status") == "failed" for r in report.get("results") or [])


def serving_verify_failed_hosts(reports):
    return sorted(h for h, rep in (reports or {}).items() if _host_failed(_report_of(rep)))


def _one_line(text, limit=160):
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def serving_verify_summary(reports):
    """A short text summary: one line per check per host, then the verdict."""
    lines = []
    reports = reports or {}
    for host in sorted(reports):
        rep = _report_of(reports[host])
        if rep.get("error"):
            lines.append("%s: ERROR %s" % (host, _one_line(rep["error"])))
            continue
        s = rep.get("summary") or {}
        lines.append("%s: %s (%s, model %s): %d passed, %d failed, %d skipped, %d warn" % (
            host, rep.get("base_url"), rep.get("engine"), rep.get("model"), s.get("passed", 0),
            s.get("failed", 0), s.get("skipped", 0), s.get("warn", 0)))
        for r in rep.get("results") or []:
            lines.append("  %-7s %-18s %7.2fs  %s" % (r.get("status", "?").upper(), r.get("name"),
                                                  float(r.get("seconds") or 0), _one_line(r.get("detail"))))
            if r.get("status") == "failed" and r.get("fix"):
                lines.append("          fix: %s" % _one_line(r["fix"], 200))
    failed = serving_verify_failed_hosts(reports)
    if not reports:
        lines.append("no serving node reported")
    elif failed:
        lines.append("VERDICT: FAILED on %s" % ", ".join(failed))
    else:
        lines.append("VERDICT: PASSED on %d node(s)" % len(reports))
    return "\n".join(lines) + "\n"


def serving_verify_junit(reports):
    """JUnit XML: one testsuite per host, one testcase per check (skipped/failure/error)."""
    reports = reports or {}
    suites = []
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
    for host in sorted(reports):
        rep = _report_of(reports[host])
        cases = []
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
        if rep.get("error"):
            counts["tests"] = counts["errors"] = 1
            cases.append('    <testcase classname=%s name="verify"><error message=%s/></testcase>'
                         % (quoteattr("serving_verify." + host), quoteattr(_one_line(rep["error"], 500))))
        for r in rep.get("results") or []:
            secs = float(r.get("seconds") or 0)
            counts["tests"] += 1
            counts["time"] += secs
            head = '    <testcase classname=%s name=%s time="%.3f"' % (
                quoteattr("serving_verify." + host), quoteattr(str(r.get("name"))), secs)
            status = r.get("status")
            if status == "failed":
                counts["failures"] += 1
                body = escape("%s\ncause: %s\nfix: %s" % (r.get("detail"), r.get("cause", ""), r.get("fix", "")))
                cases.append("%s><failure message=%s>%s</failure></testcase>" % (
                    head, quoteattr(_one_line(r.get("detail"), 500)), body))
            elif status == "skipped":
                counts["skipped"] += 1
                cases.append("%s><skipped message=%s/></testcase>" % (head, quoteattr(_one_line(r.get("detail"), 500))))
            else:
                out = "<system-out>%s</system-out>" % escape(str(r.get("detail"))) if r.get("detail") else ""
                cases.append("%s>%s</testcase>" % (head, out))
        for key in totals:
            totals[key] += counts[key]
        suites.append('  <testsuite name=%s tests="%d" failures="%d" errors="%d" skipped="%d" time="%.3f">\n%s\n  </testsuite>'
                      % (quoteattr("serving_verify." + host), counts["tests"], counts["failures"], counts["errors"],
                         counts["skipped"], counts["time"], "\n".join(cases)))
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<testsuites name="serving_verify" tests="%d" failures="%d" errors="%d" skipped="%d" time="%.3f">\n%s\n</testsuites>\n'
            % (totals["tests"], totals["failures"], totals["errors"], totals["skipped"], totals["time"],
               "\n".join(suites)))


class FilterModule(object):
    def filters(self):
        return {
            "serving_verify_reports": serving_verify_reports,
            "serving_verify_summary": serving_verify_summary,
            "serving_verify_junit": serving_verify_junit,
            "serving_verify_failed_hosts": serving_verify_failed_hosts,
        }
