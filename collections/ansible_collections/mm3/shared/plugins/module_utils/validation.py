# -*- coding: utf-8 -*-
# The one home of every input check the project makes: pins (git commits, sha256 digests, image
# IDs and digest references), control characters, IP addresses, networks and loopback, host
# names, ports and bounded numbers, absolute paths, and the strength of a secret. Filters
# (filter_plugins/), modules (library/), the Jinja tests (test_plugins/) and the node's weights
# re-check import these functions; none keeps a copy. Pure functions, standard library only (the
# re-check runs on a node without Ansible); unit tests: tests/unit/test_validation.py.
"""Input checks shared by every filter, module and helper of the project."""

from __future__ import annotations

import ipaddress
import posixpath
import re
import urllib.parse

# A control character (C0, DEL, C1): in a value that reaches a unit file, a configuration file
# or argv, a newline injects a line, in argv a second command.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Every pattern below is used with fullmatch: `$` would accept a final newline.
_GIT_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
# RFC 1123 host names, lower case (callers lower-case what they accept case-insensitively).
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")
# An image repository as docker reads it (distribution/reference, reference.go and normalize.go):
# an optional registry (a host with a '.' or a port, or localhost), then path components of
# lower-case letters and digits joined by '.', '_', '__' or dashes. Stricter than docker in one
# place: a first component without '.' or ':' is never a registry (docker would take
# "LMSYSORG/sglang" as the registry host LMSYSORG).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = r"(?:%s(?:\.%s)+(?::[0-9]+)?|%s:[0-9]+|localhost)" % (_DOMAIN_LABEL, _DOMAIN_LABEL, _DOMAIN_LABEL)
_REPOSITORY = re.compile(r"(?:%s/)?%s(?:/%s)*" % (_DOMAIN, _PATH_COMPONENT, _PATH_COMPONENT))
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# Values copied from an example rather than generated.
SECRET_MIN_LENGTH = 32
SECRET_PLACEHOLDERS = ("changeme", "change-me", "change_me", "replaceme", "replace-me", "replace_me",
                       "your-api-key", "your_api_key", "yourapikey", "placeholder", "example")
# The longest name a Linux filesystem takes for one path component (NAME_MAX) and for a path
# (PATH_MAX, with its terminating NUL), in bytes.
NAME_MAX = 255
PATH_MAX = 4095
# The tokens one request may generate: the range of the engine's own cap
# (serving_max_output_tokens) and of a gateway client's max_tokens, which may not exceed it.
OUTPUT_TOKENS_RANGE = (1, 10000000)


def type_name(value):
    """The plain type name of a value for a message ('str', 'int', 'bool', 'list', 'dict', ...),
    never an internal subclass such as Ansible's tagged strings."""
    for kind in (bool, int, float, str, list, tuple, dict):
        if isinstance(value, kind):
            return kind.__name__
    return "null" if value is None else type(value).__name__


# --- pins -----------------------------------------------------------------------------------

def is_git_commit(value):
    """A full git object id: 40 lower-case hex digits (a commit: the weights revision; a blob)."""
    return isinstance(value, str) and bool(_GIT_COMMIT.fullmatch(value))


def is_sha256(value):
    """A sha256 digest: 64 lower-case hex digits (a manifest pin, a file digest)."""
    return isinstance(value, str) and bool(_SHA256.fullmatch(value))


def is_image_id(value):
    """'sha256:<64 hex>': an image digest or image ID as docker prints it."""
    return isinstance(value, str) and bool(_IMAGE_ID.fullmatch(value))


_NAME_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")


def is_revision_path(value):
    """'<org>/<name>/<40-hex commit>': one revision's directory relative to a weights root (the
    layout serving's weights_layout defines)."""
    parts = value.split("/") if isinstance(value, str) else []
    return (len(parts) == 3 and is_git_commit(parts[2])
            and all(_NAME_COMPONENT.fullmatch(p) and p not in (".", "..") for p in parts[:2]))


def is_image_repository(value):
    """An image repository docker reads as one (no tag, no digest, never an option)."""
    return isinstance(value, str) and bool(_REPOSITORY.fullmatch(value)) and len(value) <= 255


def is_image_tag(value):
    """A tag docker accepts (letters, digits, '_', '.', '-'; not starting with '.' or '-')."""
    return isinstance(value, str) and bool(_TAG.fullmatch(value))


def is_digest_reference(value):
    """'<repository>@sha256:<64 hex>': an image pinned by its registry digest."""
    if not isinstance(value, str) or "@" not in value:
        return False
    repository, digest = value.rsplit("@", 1)
    return is_image_repository(repository) and is_image_id(digest)


# --- control characters ---------------------------------------------------------------------

def has_control(text):
    """True when a string holds a control character (C0, DEL or C1)."""
    return isinstance(text, str) and bool(CONTROL_RE.search(text))


def control_problems(value, where):
    """One problem per string under `value`, keys of mappings included, that holds a control
    character, named by its path (where.key[index])."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            if has_control(key):
                found.append("%s has a key %r, which holds a control character (newline, tab, ...): "
                             "it would break the file or the command line it reaches; write it on one "
                             "line without them." % (where, key))
            found += control_problems(item, "%s.%s" % (where, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found += control_problems(item, "%s[%d]" % (where, index))
    elif has_control(value):
        found.append("%s is %r, which holds a control character (newline, tab, ...): it would break "
                     "the file or the command line it reaches; write it on one line without them."
                     % (where, value))
    return found


# --- addresses and names --------------------------------------------------------------------

def ip_address(value):
    """The address as ipaddress reads a string, or None: a name, brackets, surrounding spaces
    and an IPv6 zone id (fe80::1%eth0, which no -p, firewall or config here takes) are not."""
    if not isinstance(value, str):
        return None
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    return None if getattr(address, "scope_id", None) else address


def is_ip(value):
    """True for an IPv4 or IPv6 address literal (no name, no brackets, no zone id)."""
    return ip_address(value) is not None


def is_loopback(value):
    """True for 127.0.0.0/8, ::1, their IPv4-mapped forms (::ffff:127.0.0.1) and 'localhost'."""
    if isinstance(value, str) and value.strip().lower() == "localhost":
        return True
    address = ip_address(value.strip() if isinstance(value, str) else value)
    if address is None:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def is_protected_endpoint(value):
    """An https:// URL with a host, or http:// to a loopback host (a local mirror or a tunnel
    on this machine): never plain HTTP across a network, where a token and the bytes it fetches
    travel unprotected. No control character, user info or whitespace."""
    if not isinstance(value, str) or has_control(value) or any(c.isspace() for c in value):
        return False
    try:
        parts = urllib.parse.urlsplit(value)
        host = parts.hostname
    except ValueError:
        return False
    if not host or "@" in parts.netloc:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and is_loopback(host))


def bind_address_problem(value, name):
    """Why `value` cannot be an address a service binds and docker -p publishes, or None: an IP
    literal that is not multicast, not the IPv4 broadcast address and not IPv6 link-local (which
    needs a zone id no -p takes). 0.0.0.0 and :: (every address) are addresses too."""
    address = ip_address(value)
    if address is None:
        return ("%s %r is not an IP address (no name, brackets or zone id): set an address of this "
                "host (127.0.0.1 keeps it on loopback)." % (name, value))
    if address.is_multicast or str(address) == "255.255.255.255" or (
            address.version == 6 and address.is_link_local):
        return ("%s %s is a %s address, which a server cannot listen on for clients: set an address of "
                "this host (127.0.0.1 keeps it on loopback)."
                % (name, address, "multicast" if address.is_multicast else
                   "broadcast" if address.version == 4 else "link-local"))
    return None


def is_hostname(value):
    """An RFC 1123 host name (case-insensitive, a trailing dot refused)."""
    return isinstance(value, str) and bool(_HOSTNAME.fullmatch(value.lower()))


def is_host(value):
    """An IP address literal or a host name."""
    return is_ip(value) or is_hostname(value)


def networks(items, name):
    """(networks in CIDR form, problems) of a list of networks or addresses: each entry as
    ipaddress reads it once surrounding spaces are removed (host bits allowed), normalised."""
    if not isinstance(items, list):
        return [], ["%s is a %s: list networks in CIDR form, e.g. ['10.20.0.0/16']."
                    % (name, type_name(items))]
    result, problems = [], []
    for item in items:
        try:
            if isinstance(item, bool) or not isinstance(item, str):
                raise ValueError(item)
            result.append(str(ipaddress.ip_network(item.strip(), strict=False)))
        except ValueError:
            problems.append("%s entry %r is not a network (CIDR like 10.20.0.0/16 or an address): fix %s."
                            % (name, item, name))
    return result, problems


def is_word(value):
    """One non-empty token without whitespace or control characters (a value that reaches one
    line of a configuration file: a newline would add a line of its own)."""
    return isinstance(value, str) and bool(value) and not has_control(value) and not any(
        ch.isspace() for ch in value)


_PLAIN_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")


def is_plain_name(value):
    """A name that is safe in a log line, a map file and a file name: lower-case letters, digits,
    '_', '.', '-', starting with a letter or digit, at most 63 (a gateway client, a release key)."""
    return isinstance(value, str) and bool(_PLAIN_NAME.fullmatch(value))


def is_http_url(value):
    """An http(s) URL with a host, as one word (no whitespace, no control character)."""
    return is_word(value) and bool(re.match(r"https?://[^/?#]+", value))


# --- numbers ---------------------------------------------------------------------------------

def whole_number(value, low, high):
    """An int (or a string of digits, as -e gives it) within [low, high], else None. A boolean
    (YAML `yes`) is never a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        return None
    return number if low <= number <= high else None


def number(value, low, high):
    """A finite int or float (or a string of one) within [low, high], else None."""
    if isinstance(value, bool):
        return None
    try:
        result = float(value) if not isinstance(value, int) else value
    except (TypeError, ValueError):
        return None
    if result != result or result in (float("inf"), float("-inf")):
        return None
    return result if low <= result <= high else None


def port_problem(value, name):
    """(port as int or None, problem or None): 1-65535, an int or a string of digits (an -e
    extra var); never a boolean (YAML `yes`) or a float."""
    port = whole_number(value, 1, 65535)
    if port is not None:
        return port, None
    kind = "" if isinstance(value, (int, str)) and not isinstance(value, bool) else " (%s)" % type_name(value)
    return None, "%s is %r%s: set a TCP port number between 1 and 65535." % (name, value, kind)


# --- paths ----------------------------------------------------------------------------------

def absolute_path_problem(path, name, example="/data/models"):
    """Why `path` cannot be the host side of a mount or a directory the roles create, or None:
    absolute, normalised (no '..', '.', '//'), no ':' or ',' (docker -v and --mount separators),
    no control character. One trailing '/' is tolerated (the caller strips it)."""
    fix = "set %s to an absolute, normalised path such as %s" % (name, example)
    if not isinstance(path, str) or not path:
        return "%s is %r: %s." % (name, path, fix)
    if has_control(path) or ":" in path or "," in path:
        return "%s %r holds ':', ',' or a control character: %s." % (name, path, fix)
    bare = path.rstrip("/") if len(path) > 1 else path
    if not bare.startswith("/") or ".." in bare.split("/") or posixpath.normpath(bare) != bare:
        return ("%s %r is not absolute and normalised (no '..', '.' or '//'): %s." % (name, path, fix))
    return path_length_problem(bare, name)


def path_length_problem(path, name):
    """Why a path is longer than Linux takes (a component over NAME_MAX bytes, the whole over
    PATH_MAX), or None: a mkdir or a mount would fail half-way, after other changes."""
    encoded = path.encode("utf-8")
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > NAME_MAX:
        return ("%s has a path component of %d bytes (Linux takes at most %d per component): shorten "
                "it." % (name, longest, NAME_MAX))
    if len(encoded) > PATH_MAX:
        return "%s is %d bytes long (Linux takes at most %d): shorten it." % (name, len(encoded), PATH_MAX)
    return None


# --- secrets --------------------------------------------------------------------------------

def secret_problem(value, name, fix):
    """Why `value` cannot be used as a key or token, or None. Never echoes the value.
    `fix` says what to do (e.g. "set X to a random string ..."); `name` is what it is called."""
    if value is None:
        return "%s is set but null: %s." % (name, fix)
    if not isinstance(value, str):
        return "%s is a %s, not a string: %s." % (name, type_name(value), fix)
    if not value:
        return "%s is empty: %s." % (name, fix)
    if has_control(value) or any(ch.isspace() for ch in value):
        return "%s holds whitespace or a control character: %s." % (name, fix)
    if len(value) < SECRET_MIN_LENGTH:
        return "%s has %d characters (at least %d): %s." % (name, len(value), SECRET_MIN_LENGTH, fix)
    lowered = value.lower()
    if any(word in lowered for word in SECRET_PLACEHOLDERS) or len(set(value)) < 8:
        return "%s looks like a placeholder, not a random key: %s." % (name, fix)
    if value.isdigit():
        return "%s is digits only (a number, not a random key): %s." % (name, fix)
    period = _repeat_period(value)
    if period:
        return ("%s repeats a pattern of %d characters (not a random key): %s." % (name, period, fix))
    return None


def _repeat_period(value):
    """The length of the shortest block whose repetition makes up `value` (abcdefgh x 4: 8), or 0
    when there is none shorter than half of it."""
    for period in range(1, len(value) // 2 + 1):
        if value == (value[:period] * (len(value) // period + 1))[:len(value)]:
            return period
    return 0
