# -*- coding: utf-8 -*-
# The serving_verify module's HTTP client: JSON requests and SSE streams over
# ansible.module_utils.urls (Request.open, what open_url calls; thread-safe, no module object
# needed), so the benchmark can run requests from worker threads. The TLS context is built once
# per client: open_url builds one per request, re-reading and parsing every system CA file in
# Python, which under a 64-thread benchmark showed up as seconds of client-side TTFT. Every call returns a Response and never raises for
# HTTP or network errors: the checks turn them into results.
from __future__ import annotations

import json
import socket
import ssl
import time

from ansible.module_utils.urls import Request, make_context
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError


class Response(object):
    def __init__(self, status=None, body=None, error=None, seconds=0.0):
        self.status = status      # HTTP status, None when no answer came back
        self.body = body          # parsed JSON (dict/list) or text
        self.error = error        # network error text, or the HTTP error body
        self.seconds = seconds

    @property
    def ok(self):
        return self.status is not None and 200 <= self.status < 300

    def describe(self):
        if self.status is None:
            return "no answer (%s)" % self.error
        if self.ok:
            return "HTTP %d" % self.status
        return "HTTP %d: %s" % (self.status, _short(self.error))


def _short(text, limit=300):
    text = text if isinstance(text, str) else repr(text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _error_text(exc):
    try:
        body = exc.read()
        body = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else str(body)
    except Exception:  # pylint: disable=broad-except
        body = ""
    try:
        parsed = json.loads(body)
        msg = parsed.get("message") or (parsed.get("error") or {}).get("message") or parsed.get("detail")
        if msg:
            return str(msg)
    except (ValueError, AttributeError):
        pass
    return body or str(exc)


class Client(object):
    """base_url like http://127.0.0.1:30000; api_key sent as a bearer token unless auth=False."""

    def __init__(self, base_url, api_key=None, timeout=60.0, validate_certs=True, ca_path=None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.validate_certs = validate_certs
        if self.base_url.startswith("https"):
            # ca_path: the site CA a gateway's certificate chains to (instead of the system store).
            self.context = make_context(cafile=ca_path, validate_certs=validate_certs)
        else:
            # Plain http never uses it; a bare context keeps Request.open from building one.
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

    def _headers(self, auth, key):
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        use = key if key is not None else self.api_key
        if auth and use:
            headers["Authorization"] = "Bearer %s" % use
        return headers

    def _open(self, method, path, payload, timeout, auth, key):
        data = json.dumps(payload).encode("utf-8") if payload is not None else None
        return Request().open(
            method,
            self.base_url + path,
            data=data,
            headers=self._headers(auth, key),
            timeout=timeout if timeout is not None else self.timeout,
            validate_certs=self.validate_certs,
            follow_redirects="none",
            use_proxy=False,
            context=self.context,
        )

    def request(self, method, path, payload=None, timeout=None, auth=True, key=None):
        start = time.monotonic()
        try:
            resp = self._open(method, path, payload, timeout, auth, key)
            raw = resp.read()
            status = resp.getcode()
        except HTTPError as exc:
            return Response(exc.code, None, _error_text(exc), time.monotonic() - start)
        except (URLError, socket.timeout, socket.error, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return Response(None, None, "%s" % reason, time.monotonic() - start)
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        try:
            body = json.loads(text) if text else None
        except ValueError:
            body = text
        return Response(status, body, None, time.monotonic() - start)

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, payload, **kwargs):
        return self.request("POST", path, payload, **kwargs)

    def stream(self, path, payload, on_line, timeout=None):
        """POST with stream=true; call on_line(line_bytes, t_monotonic) for every line.

        Returns (Response, start) where Response.body is None (the caller collects events).
        """
        start = time.monotonic()
        try:
            resp = self._open("POST", path, payload, timeout, True, None)
            status = resp.getcode()
            while True:
                line = resp.readline()
                if not line:
                    break
                on_line(line, time.monotonic())
        except HTTPError as exc:
            return Response(exc.code, None, _error_text(exc), time.monotonic() - start), start
        except (URLError, socket.timeout, socket.error, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return Response(None, None, "%s" % reason, time.monotonic() - start), start
        return Response(status, None, None, time.monotonic() - start), start
