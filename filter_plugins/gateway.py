# -*- coding: utf-8 -*-
"""Filters of the `gateway` role: resolve the site's gateway choices into `gateway_spec`.

The gateway (HAProxy, from the distribution's archive) is the only thing clients reach: it
terminates TLS, authenticates named client keys, applies each client's limits and the media
policy, and forwards the few OpenAI-compatible paths to an engine that listens on loopback
with no key. Everything that decides something lives here, as pure functions that pytest calls
directly (tests/unit/test_gateway_filters.py); the role only wires them and renders files.

`gateway_resolve` never raises for bad input: each problem becomes one line in
spec['blockers'] naming the fix, and the role refuses before anything changes. Client keys
never enter the spec: only their SHA-256 (HAProxy hashes the presented key with its `sha2`
converter and looks the digest up), so the spec can be printed and the gateway host holds no
key in clear.
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import re

from ansible_collections.mm3.shared.plugins.module_utils import validation as v

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    HAS_CRYPTOGRAPHY = True
except ImportError:  # pragma: no cover - cryptography ships with ansible-core
    HAS_CRYPTOGRAPHY = False

# What a client may send unless its entry says otherwise.
CLIENT_DEFAULTS = {"requests_per_minute": 600, "concurrent": 16, "max_body_bytes": 2 * 1024 * 1024,
                   "max_tokens": 8192}
CLIENT_LIMITS = {"requests_per_minute": (1, 1000000), "concurrent": (1, 100000),
                 "max_body_bytes": (1024, 64 * 1024 * 1024), "max_tokens": v.OUTPUT_TOKENS_RANGE}
# The limits a client's whole traffic shares: each gateway instance counts only what reaches it
# (HAProxy's stick tables are per process; peers replicate entries, they do not add them up), so
# where a client's requests spread over N instances each enforces 1/N (rounded down). A body or
# max_tokens limit is per request and is not divided.
SHARED_LIMITS = ("requests_per_minute", "concurrent")
LIMIT_SHARE_RANGE = (1, 1000)
# The only paths clients reach (method, exact path or prefix); everything else is 404.
CLIENT_PATHS = [
    {"path": "/v1/chat/completions", "methods": ["POST"], "body": True},
    {"path": "/v1/completions", "methods": ["POST"], "body": True},
    {"path": "/v1/models", "methods": ["GET"], "body": False},
]
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
# HAProxy's own exporter (the distribution's build has USE_PROMEX): requests, answers per
# class, backend servers up; served, like METRICS_PATH, only to gateway_metrics_networks.
GATEWAY_METRICS_PATH = "/gateway/metrics"
# Paths the engines serve that a client must never reach through the gateway (vLLM's
# /invocations has no key check at all; SGLang's admin endpoints change the server). The
# verification probes each of them; the gateway answers them 404 like any unknown path.
ENGINE_PRIVATE_PATHS = ["/invocations", "/tokenize", "/detokenize", "/server_info",
                        "/get_server_info", "/get_model_info", "/flush_cache",
                        "/update_weights_from_disk", "/update_weights_from_tensor",
                        "/start_profile", "/v1/load_lora_adapter", "/pooling", "/v1/embeddings",
                        "/metrics", "/version", "/ping", "/v2/models"]


def key_digest(key):
    """The SHA-256 hex of a client key, as HAProxy's `sha2(256),hex,lower` computes it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_problem(name, key):
    """Why a client key cannot be used, or None. Never echoes the key."""
    fix = ("set gateway_clients[%s].key to a random string of at least %d characters "
           "(openssl rand -hex 32), vaulted" % (name, v.SECRET_MIN_LENGTH))
    if not isinstance(key, str) or not key:
        return "gateway client '%s' has no key (or not a string): %s." % (name, fix)
    return v.secret_problem(key, "gateway client '%s' key" % name, fix)


def clients_resolve(clients):
    """(resolved clients without keys, blockers). Names unique and plain, keys unique and long,
    limits whole numbers in range."""
    blockers = []
    resolved = []
    if not isinstance(clients, list) or not clients:
        return [], ["gateway_clients is empty (or not a list): name at least one client, e.g. "
                    "[{name: app, key: \"{{ vault_app_key }}\"}]; nobody could use the gateway."]
    seen_names = set()
    seen_digests = {}
    for index, client in enumerate(clients):
        if not isinstance(client, dict):
            blockers.append("gateway_clients[%d] is a %s, not a mapping with name and key."
                            % (index, v.type_name(client)))
            continue
        name = client.get("name")
        if not v.is_plain_name(name):
            blockers.append("gateway_clients[%d].name %r is not a plain name (lowercase letters, "
                            "digits, '.', '_', '-'; at most 63): rename it." % (index, name))
            continue
        if name in seen_names:
            blockers.append("gateway client name '%s' appears twice: give each client its own "
                            "name (it is what the access log records)." % name)
            continue
        seen_names.add(name)
        unknown = sorted(set(client) - set(CLIENT_DEFAULTS) - {"name", "key"})
        if unknown:
            blockers.append("gateway client '%s' has unknown settings %s; known: %s." % (
                name, ", ".join(unknown), ", ".join(["name", "key"] + sorted(CLIENT_DEFAULTS))))
        problem = key_problem(name, client.get("key"))
        if problem:
            blockers.append(problem)
            continue
        digest = key_digest(client["key"])
        if digest in seen_digests:
            blockers.append("gateway clients '%s' and '%s' have the same key: each client needs "
                            "its own (limits and logs are per key)." % (seen_digests[digest], name))
            continue
        seen_digests[digest] = name
        limits, problems = client_limits(name, client)
        blockers += problems
        resolved.append(dict({"name": name, "key_sha256": digest}, **limits))
    return resolved, blockers


def client_limits(name, client):
    """({setting: whole number} of CLIENT_DEFAULTS for one gateway_clients entry, the default
    where it leaves one out, blockers for a value out of CLIENT_LIMITS). Never reads the key."""
    limits, blockers = {}, []
    for setting, default in CLIENT_DEFAULTS.items():
        low, high = CLIENT_LIMITS[setting]
        value = client.get(setting, default)
        number = v.whole_number(value, low, high)
        if number is None:
            blockers.append("gateway client '%s' %s is %r: set a whole number between %d and %d."
                            % (name, setting, value, low, high))
            number = default
        limits[setting] = number
    return limits, blockers


def gateway_policy(clients, allowed_networks=None, metrics_networks=None, media_allowlist=None):
    """What the gateway lets clients do, as a signed release binds it (issue 33; the serving role
    compares it with the release's gateway_policy): every client's name and limits (the totals,
    before limit_share divides them among instances), the client and metrics networks, the media
    allowlist and the client paths; sorted, so the order of the inventory's lists does not count.
    The keys are not part of it: a client's key is rotated without a new release (adding or
    removing a client is a new release). None when an input is one gateway_resolve refuses (the
    gateway role then names it)."""
    if not isinstance(clients, list) or not clients:
        return None
    entries = []
    for client in clients:
        if not isinstance(client, dict) or not v.is_plain_name(client.get("name")):
            return None
        limits, problems = client_limits(client["name"], client)
        if problems:
            return None
        entries.append(dict({"name": client["name"]}, **limits))
    allowed, problems = v.networks(allowed_networks if allowed_networks is not None else [], "gateway_allowed_networks")
    metrics, more = v.networks(metrics_networks if metrics_networks is not None else [], "gateway_metrics_networks")
    media, media_problems = media_allowlist_problems(media_allowlist if media_allowlist is not None else [])
    if problems or more or media_problems or len({c["name"] for c in entries}) != len(entries):
        return None
    return {"clients": sorted(entries, key=lambda c: c["name"]), "allowed_networks": sorted(set(allowed)),
            "metrics_networks": sorted(set(metrics)), "media_allowlist": media,
            "client_paths": copy.deepcopy(CLIENT_PATHS)}


def media_allowlist_problems(entries):
    """(lowercased host names, blockers). Default (empty): data URIs only."""
    if not isinstance(entries, list):
        return [], ["gateway_media_allowlist is a %s: list host names, e.g. ['images.intranet']."
                    % v.type_name(entries)]
    result, blockers = [], []
    for item in entries:
        host = str(item).strip().lower().rstrip(".") if isinstance(item, str) else ""
        if not v.is_hostname(host) or v.is_ip(host):
            blockers.append("gateway_media_allowlist entry %r is not a host name (no scheme, path, "
                            "port, wildcard or address): write it as images.intranet." % (item,))
        else:
            result.append(host)
    return sorted(set(result)), blockers


def tls_problems(cert_pem, key_pem, now=None):
    """Blockers for the gateway's certificate and key: both PEM, the key matches the
    certificate's public key, and the certificate is valid now. Returns (facts, blockers)."""
    fix = "set gateway_tls_cert_pem and gateway_tls_key_pem (vaulted) to a matching pair"
    if not cert_pem or not key_pem:
        return {}, ["gateway_tls_cert_pem or gateway_tls_key_pem is not set: %s (the lab "
                    "generates a site CA; a site uses its own)." % fix]
    if not HAS_CRYPTOGRAPHY:  # pragma: no cover
        return {}, ["the controller's Python lacks the cryptography package: install it."]
    try:
        certs = x509.load_pem_x509_certificates(str(cert_pem).encode())
    except ValueError as exc:
        return {}, ["gateway_tls_cert_pem is not a PEM certificate (%s): %s." % (exc, fix)]
    try:
        key = serialization.load_pem_private_key(str(key_pem).encode(), password=None)
    except (ValueError, TypeError) as exc:
        return {}, ["gateway_tls_key_pem is not an unencrypted PEM private key (%s): %s."
                    % (str(exc).split("\n")[0], fix)]
    leaf = certs[0]
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    blockers = []
    if leaf.public_key().public_bytes(der, public) != key.public_key().public_bytes(der, public):
        blockers.append("gateway_tls_key_pem does not belong to gateway_tls_cert_pem (their public "
                        "keys differ): %s." % fix)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    not_after = leaf.not_valid_after_utc
    not_before = leaf.not_valid_before_utc
    if not_after <= now:
        blockers.append("gateway_tls_cert_pem expired on %s: renew the certificate."
                        % not_after.strftime("%Y-%m-%d"))
    elif not_before > now:
        blockers.append("gateway_tls_cert_pem is not valid before %s: check the clock or the "
                        "certificate." % not_before.strftime("%Y-%m-%d"))
    facts = {"subject": leaf.subject.rfc4514_string(), "not_after": not_after.strftime("%Y-%m-%dT%H:%M:%SZ"),
             "chain_length": len(certs)}
    return facts, blockers


def upstreams_problems(upstreams):
    """(upstreams, blockers): each {name, address, port, tls}."""
    if not isinstance(upstreams, list) or not upstreams:
        return [], ["the gateway has no upstream: serving_spec (engine on this node) or the "
                    "`nodes` group must name at least one."]
    result, blockers = [], []
    for index, item in enumerate(upstreams):
        if not isinstance(item, dict):
            blockers.append("gateway upstream %d is not a mapping." % index)
            continue
        name = str(item.get("name", ""))
        port = v.whole_number(item.get("port"), 1, 65535)
        address = str(item.get("address", "")).strip()
        ok_address = v.is_host(address)
        if not v.is_plain_name(name.lower()) or port is None or not ok_address:
            blockers.append("gateway upstream %r is not {name, address (IP or host name), port "
                            "1-65535}: fix gateway_upstreams (a fleet gateway takes each node's port "
                            "from the gateway_endpoint serve.yml publishes on the node)." % (item,))
            continue
        result.append({"name": name.lower(), "address": address, "port": port,
                       "tls": bool(item.get("tls", False))})
    return result, blockers


def gateway_resolve(clients, port=8443, bind_address="0.0.0.0", allowed_networks=None,
                    metrics_networks=None, media_allowlist=None, upstreams=None,
                    tls_cert_pem=None, tls_key_pem=None, upstream_timeout_s=3600,
                    engine_bind_address=None, engine="vllm", max_connections=2048,
                    max_connections_per_source=512, log_queue=1024, now=None, engine_max_output_tokens=None,
                    limit_share=1, log_rate_limit_burst=1000000):
    """Resolve the gateway choices into gateway_spec. Never raises; see the module docstring.
    engine_max_output_tokens: the engine's own cap (serving_spec.max_output_tokens; None on a fleet
    gateway): a client allowed more would get answers the engine cuts short without saying why.
    limit_share: the gateway instances a client's requests spread over (limit_share_default):
    each client's rate and concurrency here are its limits divided by it (shared_limits)."""
    blockers = []
    resolved_clients, problems = clients_resolve(clients)
    blockers += problems
    share, problem = limit_share_problem(limit_share)
    if problem:
        blockers.append(problem)
    for index, client in enumerate(resolved_clients):
        resolved_clients[index], problems = shared_limits(client, share or 1)
        resolved_clients[index]["limits_total"] = {k: client[k] for k in SHARED_LIMITS}
        blockers += problems
    engine_cap = v.whole_number(engine_max_output_tokens, *v.OUTPUT_TOKENS_RANGE)
    for client in resolved_clients if engine_cap else []:
        if client["max_tokens"] > engine_cap:
            blockers.append("gateway client %s may ask for max_tokens %d, above the engine's own cap of %d "
                            "(serving_max_output_tokens): lower its max_tokens or raise serving_max_output_tokens."
                            % (client["name"], client["max_tokens"], engine_cap))
    gw_port, problem = v.port_problem(port, "gateway_port")
    if problem:
        blockers.append(problem)
    problem = v.bind_address_problem(bind_address, "gateway_bind_address")
    if problem:
        blockers.append(problem + " (0.0.0.0 with gateway_allowed_networks listens on every address.)")
    allowed, problems = v.networks(allowed_networks if allowed_networks is not None else [],
                                   "gateway_allowed_networks")
    blockers += problems
    if not allowed and not problems:
        blockers.append("gateway_allowed_networks is empty: list the client networks that may reach "
                        "the gateway (CIDR), e.g. ['10.20.0.0/16']; the firewall admits nobody else.")
    metrics, problems = v.networks(metrics_networks or [], "gateway_metrics_networks")
    blockers += problems
    media, problems = media_allowlist_problems(media_allowlist if media_allowlist is not None else [])
    blockers += problems
    ups, problems = upstreams_problems(upstreams)
    blockers += problems
    if len({up["tls"] for up in ups}) > 1:
        blockers.append("gateway_upstreams mixes TLS and plain upstreams: a node gateway forwards to "
                        "its engine on loopback, a fleet gateway only to node gateways over TLS.")
    for up in ups:
        if not up["tls"] and not v.is_loopback(up["address"]):
            blockers.append("gateway upstream %s (%s) is neither loopback nor TLS: the engine must "
                            "listen on 127.0.0.1 behind the gateway (serving_bind_address), and a "
                            "fleet gateway reaches nodes through their own gateways." % (up["name"], up["address"]))
    # None: no engine on this host (a fleet gateway)
    if engine_bind_address is not None and not v.is_loopback(engine_bind_address):
        blockers.append("serving_bind_address is %s while a gateway fronts the engine: set "
                        "serving_bind_address: 127.0.0.1 (only the gateway may reach the engine)."
                        % engine_bind_address)
    timeout = v.whole_number(upstream_timeout_s, 10, 86400)
    if timeout is None:
        blockers.append("gateway_upstream_timeout_s is %r: set seconds between 10 and 86400 (long "
                        "generations stream for minutes)." % (upstream_timeout_s,))
    # Connections the gateway holds at once (each may hold one buffer of bufsize while its
    # headers or an authenticated body arrive), and from one client address.
    conns = v.whole_number(max_connections, 64, 1000000)
    if conns is None:
        blockers.append("gateway_max_connections is %r: set a number of connections between 64 and "
                        "1000000 (each may hold one request buffer of the largest client body limit)."
                        % (max_connections,))
    per_source = v.whole_number(max_connections_per_source, 1, conns or 1000000)
    if per_source is None:
        blockers.append("gateway_max_connections_per_source is %r: set a number between 1 and "
                        "gateway_max_connections (%s)." % (max_connections_per_source, conns))
    # Datagrams the log socket (journald's /dev/log) queues: HAProxy drops an access-log line
    # it cannot hand over at once (the kernel's default queue is 10).
    queue = v.whole_number(log_queue, 64, 65536)
    if queue is None:
        blockers.append("gateway_log_queue is %r: set a number of datagrams between 64 and 65536 "
                        "(net.unix.max_dgram_qlen; the kernel's default of 10 drops access-log lines "
                        "under a burst)." % (log_queue,))
    # Lines per second journald keeps from HAProxy (its drop-in): the default limit suppresses a
    # busy gateway's access log without a count anywhere.
    burst = v.whole_number(log_rate_limit_burst, 1000, 100000000)
    if burst is None:
        blockers.append("gateway_log_rate_limit_burst is %r: set the log lines per second journald keeps "
                        "from HAProxy, a whole number between 1000 and 100000000." % (log_rate_limit_burst,))
    tls, problems = tls_problems(tls_cert_pem, tls_key_pem, now=now)
    blockers += problems
    largest_body = max([c["max_body_bytes"] for c in resolved_clients] or [CLIENT_DEFAULTS["max_body_bytes"]])
    spec = {
        "port": gw_port, "bind_address": str(bind_address), "clients": resolved_clients,
        "allowed_networks": allowed, "metrics_networks": metrics, "media_allowlist": media,
        "upstreams": ups, "upstream_timeout_s": timeout, "tls": tls, "engine": engine,
        "max_connections": conns, "max_connections_per_source": per_source, "log_queue": queue,
        "limit_share": share, "log_rate_limit_burst": burst,
        "client_paths": CLIENT_PATHS, "health_path": HEALTH_PATH, "metrics_path": METRICS_PATH,
        "gateway_metrics_path": GATEWAY_METRICS_PATH,
        "private_paths": ENGINE_PRIVATE_PATHS,
        # A request body must fit one HAProxy buffer to be inspected (max_tokens, media URLs):
        # the buffer is sized for the largest client limit plus headers.
        "bufsize": _round_up(largest_body + 65536, 16384),
        "blockers": blockers,
    }
    blockers.extend(v.control_problems({k: item for k, item in spec.items() if k != "blockers"}, "gateway"))
    return spec


def _round_up(value, unit):
    return ((value + unit - 1) // unit) * unit


def gateway_blockers_text(spec):
    lines = ["gateway: refused:"] + ["  - " + b for b in spec.get("blockers", [])]
    return "\n".join(lines)


def private_paths(engine=None):
    """The engine paths no client may reach through the gateway (the verification probes them)."""
    return list(ENGINE_PRIVATE_PATHS)


def pool_name(node):
    """The server name a node has in a fleet gateway's pool (backend mm3_engines)."""
    return re.sub(r"[^a-z0-9_.-]", "-", str(node).lower())


def fleet_upstreams(nodes, hostvars):
    """A fleet gateway's upstreams: every serving node's own gateway, over TLS, at the node's
    gateway_node_address (default: its inventory name) and the port its gateway listens on (its
    gateway_endpoint, which the gateway role publishes on the node: playbooks/serve.yml runs it
    there first). A node without one gets no port, which gateway_resolve refuses naming it."""
    result = []
    for node in nodes:
        node_vars = hostvars[node]
        result.append({"name": pool_name(node),
                       "address": node_vars.get("gateway_node_address") or str(node),
                       "port": (node_vars.get("gateway_endpoint") or {}).get("port"), "tls": True})
    return result


def limit_share_default(groups, host):
    """How many gateway instances one client's traffic may spread over, for `host`'s gateway
    (gateway_limit_share's default): a fleet gateway shares with every host of the `gateway`
    group; a node gateway behind a fleet is a second line behind limits the fleet already
    divided (1); without a fleet, clients may reach every node's gateway (the `nodes` group)."""
    groups = groups if isinstance(groups, dict) else {}
    fleet = list(groups.get("gateway") or [])
    if host in fleet:
        return len(fleet)
    if fleet:
        return 1
    return max(1, len(groups.get("nodes") or []))


def shared_limits(client, share):
    """(the client's limits on one of `share` gateway instances, blockers): SHARED_LIMITS divided
    (rounded down, so the instances together never admit more than the client's limit); a limit
    below the share is refused, since an instance would admit nothing."""
    entry, blockers = dict(client), []
    for setting in SHARED_LIMITS:
        entry[setting] = client[setting] // share
        if entry[setting] < 1:
            blockers.append("gateway client '%s' %s is %d, shared by %d gateway instances "
                            "(gateway_limit_share): each would admit nothing. Raise %s to at least %d, "
                            "or set gateway_limit_share to the number of gateways its requests really reach."
                            % (client["name"], setting, client[setting], share, setting, share))
            entry[setting] = 1
    return entry, blockers


def limit_share_problem(share):
    """(the share as a whole number or None, blocker or None)."""
    number = v.whole_number(share, *LIMIT_SHARE_RANGE)
    if number is None:
        return None, ("gateway_limit_share is %r: set the number of gateway instances a client's "
                      "requests spread over, a whole number between %d and %d (default: the hosts of "
                      "the `gateway` group on a fleet gateway, else of the `nodes` group)."
                      % ((share,) + LIMIT_SHARE_RANGE))
    return number, None


def gateway_client(clients, name="", share=1):
    """The gateway client named `name` (the first one when the name is empty or unknown), with
    every limit its entry leaves out at the gateway's default (CLIENT_DEFAULTS), key included,
    and its shared limits as one of `share` gateway instances enforces them (shared_limits):
    what a check that acts as that client through one gateway needs (use it only in no_log
    tasks). {} when there is no client."""
    entries = [c for c in (clients or []) if isinstance(c, dict)]
    chosen = [c for c in entries if name and c.get("name") == name] or entries[:1]
    if not chosen:
        return {}
    client = dict(CLIENT_DEFAULTS, **chosen[0])
    number, _ = limit_share_problem(share)
    return shared_limits(client, number or 1)[0]


def gateway_keys_map(spec):
    """The map file HAProxy loads: '<sha256 of key> <client name>' per line."""
    return "".join("%s %s\n" % (c["key_sha256"], c["name"]) for c in spec["clients"])


class FilterModule(object):
    """gateway_resolve, gateway_blockers_text, gateway_keys_map, gateway_client, gateway_limit_share_default,
    gateway_private_paths, gateway_fleet_upstreams, gateway_pool_name, gateway_policy."""

    def filters(self):
        return {
            "gateway_resolve": gateway_resolve,
            "gateway_blockers_text": gateway_blockers_text,
            "gateway_keys_map": gateway_keys_map,
            "gateway_client": gateway_client,
            "gateway_limit_share_default": limit_share_default,
            "gateway_private_paths": private_paths,
            "gateway_fleet_upstreams": fleet_upstreams,
            "gateway_pool_name": pool_name,
            "gateway_policy": gateway_policy,
        }
