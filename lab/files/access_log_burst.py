#!/usr/bin/env python3
"""A burst against a node's gateway, and whether its access log kept every line of it.

Run on a lab node (lab/checks.yml): COUNT requests GET /health, PARALLEL at a time, each on its
own TLS connection verified against the site CA, from 127.0.0.1 to the gateway (which answers
/health itself: no key, no engine). Then it reads the journal from a cursor taken before the
burst until it holds COUNT access-log lines of this burst (`client=- src=127.0.0.1 method=GET
path=/health status=200`) or TIMEOUT seconds have passed, and HAProxy's DroppedLogs (`show info`
on the admin socket). Prints one JSON object: sent, answered, logged, dropped_logs, seconds.

    access_log_burst.py URL CA_FILE ADMIN_SOCKET [COUNT [PARALLEL [TIMEOUT]]]
"""
import concurrent.futures
import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

LINE = "mm3-gateway client=- src=127.0.0.1 method=GET path=/health status=200"


def cursor():
    out = subprocess.run(["journalctl", "--no-pager", "-n", "0", "--show-cursor"],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().rsplit("-- cursor: ", 1)[-1].strip()


def logged_since(mark):
    out = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "--after-cursor", mark],
                         capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith(LINE))


def dropped_logs(admin_socket):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(admin_socket)
        sock.sendall(b"show info\n")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode().splitlines():
        if line.startswith("DroppedLogs:"):
            return int(line.split(":", 1)[1])
    raise SystemExit("no DroppedLogs in show info")


def main():
    url, ca_file, admin = sys.argv[1:4]
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 400
    parallel = int(sys.argv[5]) if len(sys.argv) > 5 else 16
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 else 60
    context = ssl.create_default_context(cafile=ca_file)
    mark = cursor()
    before = dropped_logs(admin)
    started = time.monotonic()

    def one(_):
        with urllib.request.urlopen(url, context=context, timeout=30) as resp:
            return resp.status

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        answered = sum(1 for status in pool.map(one, range(count)) if status == 200)
    logged = logged_since(mark)
    while logged < count and time.monotonic() - started < timeout:
        time.sleep(1)
        logged = logged_since(mark)
    print(json.dumps({"sent": count, "answered": answered, "logged": logged,
                      "dropped_logs": dropped_logs(admin) - before,
                      "seconds": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
