#!/usr/bin/env python3
"""A bounded background client for the lab's release drill (lab/rollout.yml): it sends short
chat completions through the fleet gateway, one after the other on each of --workers threads
(--interval seconds apart, so that two CPU engines on two cores keep time for the rollout), until a stop file appears or --max-seconds pass, and counts what came back. A request fails
when the gateway answers anything but 200, the connection fails or times out, or the body is
not a completion with a choice; each failure is recorded with its time, so a failure can be
matched with the switch that caused it.

usage: lab_load_client.py --url URL --ca CA_PEM --key-file FILE --model NAME --stop-file FILE
                          --out OUT.json [--workers 2] [--interval 0.2] [--max-seconds 900]

The client key is read from --key-file (0600, written by the drill, removed after), never
taken on the command line. Standard library only: it runs on the lab's staging host.
"""
import argparse
import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.request


def one_request(url, context, key, model, timeout=60):
    """Send one completion; return None when it succeeded, else a short reason."""
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Say hello."}]}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST", headers={
        "Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
            answer = json.loads(response.read())
        if not answer.get("choices"):
            return "200 without a choice"
        return None
    except urllib.error.HTTPError as err:
        return "HTTP %d" % err.code
    except (urllib.error.URLError, OSError, ValueError) as err:
        return "%s: %s" % (type(err).__name__, getattr(err, "reason", err))


def summarize(results, started, ended):
    """The counts a drill step reports (pure: results are (time, reason-or-None) pairs)."""
    failures = [{"t": round(t - started, 2), "reason": reason} for t, reason in results if reason]
    reasons = {}
    for failure in failures:
        reasons[failure["reason"]] = reasons.get(failure["reason"], 0) + 1
    return {"requests": len(results), "ok": len(results) - len(failures), "failed": len(failures),
            "reasons": reasons, "first_failures": failures[:20], "seconds": round(ended - started, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--max-seconds", type=float, default=900)
    args = parser.parse_args()
    with open(args.key_file) as f:
        key = f.read().strip()
    context = ssl.create_default_context(cafile=args.ca)
    results, lock = [], threading.Lock()
    started = time.time()
    deadline = started + args.max_seconds

    def worker():
        while not os.path.exists(args.stop_file) and time.time() < deadline:
            reason = one_request(args.url, context, key, args.model)
            with lock:
                results.append((time.time(), reason))
            time.sleep(args.interval)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = summarize(results, started, time.time())
    summary["stopped_by"] = "stop file" if os.path.exists(args.stop_file) else "max seconds"
    with open(args.out, "w") as f:
        json.dump(summary, f)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
