# -*- coding: utf-8 -*-
# The serving_verify module's gateway checks (roles/gateway): what a client outside the node
# sees. Each check probes one protection and names the limit that answered, so the report says
# which protection held or which one is missing:
#   gateway_paths       every engine-private path answers non-200, with and without a key
#   gateway_body        a body over the limits client's byte limit -> 413 "body limit"
#   gateway_max_tokens  max_tokens over the limits client's cap -> 400 "max_tokens limit"
#   gateway_media       an image URL to a host outside the media allowlist -> 400 "media policy"
#   gateway_tls         a client that does not trust the site CA fails the handshake; the
#                       trusted one negotiates TLS 1.2 or newer
#   gateway_rate        the limits client's request rate + 1 requests -> 429 "rate limit"
# gateway_rate spends the limits client's budget for a minute: list it after the other gateway
# checks. The limits client is a named client of its own (gateway.limits_key), so the checks
# never throttle the client the other checks and the benchmark use.
from __future__ import annotations

import socket
import ssl
from urllib.parse import urlparse

from ansible_collections.mm3.shared.plugins.module_utils.serving_verify_core import check_result, image_messages

GATEWAY_CHECKS = ["gateway_paths", "gateway_body", "gateway_max_tokens", "gateway_media",
                  "gateway_tls", "gateway_rate"]
DEFAULT_BLOCKED_MEDIA_URL = "http://media-not-allowlisted.invalid/cat.png"


def _error_text(resp):
    return " ".join(str(resp.error or resp.body or "").split())[:200]


class GatewayChecks(object):
    """Mixed into Verifier: self.client, self.p, self.clock, self.model are the Verifier's."""

    @property
    def gw(self):
        return self.p.get("gateway") or {}

    def _gw_skip(self, name, what):
        return check_result(name, True, "skipped: %s" % what, 0.0, skipped=True)

    def _limits_key(self):
        return self.gw.get("limits_key")

    def check_gateway_paths(self):
        start = self.clock()
        paths = self.gw.get("private_paths") or []
        if not paths:
            return self._gw_skip("gateway_paths", "no private paths given (gateway.private_paths)")
        t = self.timeouts["request"]
        leaks, seen = [], {}
        for path in paths:
            for method in ("GET", "POST"):
                for label, auth in (("without key", False), ("with key", True)):
                    payload = {"model": self.model or "x", "prompt": "x", "max_tokens": 1} if method == "POST" else None
                    resp = self.client.request(method, path, payload, timeout=t, auth=auth)
                    seen["%s %s %s" % (method, path, label)] = resp.status
                    if resp.status is None or 200 <= resp.status < 300:
                        leaks.append("%s %s %s -> %s" % (method, path, label, resp.describe()))
        for path in ("/v1/models", "/v1/chat/completions"):
            method = "GET" if path == "/v1/models" else "POST"
            resp = self.client.request(method, path, {"model": "x", "messages": []} if method == "POST" else None,
                                       timeout=t, auth=False)
            seen["%s %s without key" % (method, path)] = resp.status
            if resp.status != 401:
                leaks.append("%s %s without key -> %s (expected 401)" % (method, path, resp.describe()))
        if leaks:
            return check_result("gateway_paths", False, "reachable through the gateway: " + "; ".join(leaks),
                                self.clock() - start, diagnosis="gateway", data=seen)
        return check_result("gateway_paths", True, "%d private paths refused (GET/POST, with and without a "
                            "key); client paths without a key 401" % len(paths), self.clock() - start, data=seen)

    def _limit_probe(self, name, payload, want_status, want_text):
        start = self.clock()
        if not self._limits_key():
            return self._gw_skip(name, "no limits client key (gateway.limits_key)")
        resp = self.client.post("/v1/chat/completions", payload, timeout=self.timeouts["request"],
                                key=self._limits_key())
        text = _error_text(resp)
        data = {"status": resp.status, "message": text}
        if resp.status == want_status and want_text in text:
            return check_result(name, True, "HTTP %d: %s" % (resp.status, text), self.clock() - start, data=data)
        return check_result(name, False, "expected HTTP %d naming '%s', got %s" % (want_status, want_text, resp.describe()),
                            self.clock() - start, diagnosis="gateway", data=data)

    def check_gateway_body(self):
        limit = int(self.gw.get("max_body_bytes") or 0)
        if not limit:
            return self._gw_skip("gateway_body", "no body limit given (gateway.max_body_bytes)")
        payload = {"model": self.model or "x", "max_tokens": 1,
                   "messages": [{"role": "user", "content": "x" * (limit + 1)}]}
        return self._limit_probe("gateway_body", payload, 413, "body limit")

    def check_gateway_max_tokens(self):
        cap = int(self.gw.get("max_tokens") or 0)
        if not cap:
            return self._gw_skip("gateway_max_tokens", "no max_tokens cap given (gateway.max_tokens)")
        payload = {"model": self.model or "x", "max_tokens": cap + 1,
                   "messages": [{"role": "user", "content": "Say OK."}]}
        return self._limit_probe("gateway_max_tokens", payload, 400, "max_tokens limit")

    def check_gateway_media(self):
        url = self.gw.get("blocked_media_url") or DEFAULT_BLOCKED_MEDIA_URL
        payload = {"model": self.model or "x", "max_tokens": 1, "messages": image_messages(url)}
        return self._limit_probe("gateway_media", payload, 400, "media policy")

    def check_gateway_tls(self):
        start = self.clock()
        parsed = urlparse(self.client.base_url)
        if parsed.scheme != "https":
            return check_result("gateway_tls", False, "the gateway URL %s is not https" % self.client.base_url,
                                self.clock() - start, diagnosis="gateway")
        host, port = parsed.hostname, parsed.port or 443
        t = self.timeouts["request"]
        data = {}
        # A client with only the system trust store must not get through (the site CA is private).
        untrusting = ssl.create_default_context()
        try:
            with socket.create_connection((host, port), timeout=t) as sock:
                with untrusting.wrap_socket(sock, server_hostname=host):
                    data["untrusting_client"] = "handshake succeeded"
        except ssl.SSLCertVerificationError as exc:
            data["untrusting_client"] = "refused: %s" % exc.verify_message
        except (ssl.SSLError, OSError) as exc:
            data["untrusting_client"] = "error: %s" % exc
        trusting = self.client.context
        try:
            with socket.create_connection((host, port), timeout=t) as sock:
                with trusting.wrap_socket(sock, server_hostname=host) as tls:
                    data["version"] = tls.version()
        except (ssl.SSLError, OSError) as exc:
            data["version"] = None
            data["trusted_error"] = str(exc)
        problems = []
        if not str(data.get("untrusting_client", "")).startswith("refused"):
            problems.append("a client without the site CA: %s (expected a verification failure)"
                            % data.get("untrusting_client"))
        if data.get("version") not in ("TLSv1.2", "TLSv1.3"):
            problems.append("the client trusting the site CA could not connect with TLS 1.2+ (%s)"
                            % (data.get("trusted_error") or data.get("version")))
        if problems:
            return check_result("gateway_tls", False, "; ".join(problems), self.clock() - start,
                                diagnosis="gateway", data=data)
        return check_result("gateway_tls", True, "%s with the site CA; without it: %s"
                            % (data["version"], data["untrusting_client"]), self.clock() - start, data=data)

    def check_gateway_rate(self):
        start = self.clock()
        rate = int(self.gw.get("rate_per_minute") or 0)
        if not rate or not self._limits_key():
            return self._gw_skip("gateway_rate", "no limits client (gateway.limits_key, gateway.rate_per_minute)")
        statuses = []
        for _ in range(rate + 1):
            resp = self.client.get("/v1/models", timeout=self.timeouts["request"], key=self._limits_key())
            statuses.append(resp.status)
            if resp.status == 429:
                text = _error_text(resp)
                ok = "rate limit" in text
                return check_result("gateway_rate", ok, "HTTP 429 after %d requests: %s" % (len(statuses), text),
                                    self.clock() - start, diagnosis=None if ok else "gateway",
                                    data={"requests": len(statuses), "message": text})
        return check_result("gateway_rate", False, "%d requests within a minute, none refused with 429 (limit %d "
                            "per minute)" % (len(statuses), rate), self.clock() - start, diagnosis="gateway",
                            data={"requests": len(statuses), "statuses": sorted(set(map(str, statuses)))})
