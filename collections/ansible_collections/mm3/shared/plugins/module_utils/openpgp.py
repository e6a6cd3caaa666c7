# -*- coding: utf-8 -*-
# The fingerprints of the primary keys in an OpenPGP public key file (armored or binary), as
# apt's keyrings hold them, without gpg: minimal hosts have only gpgv (and sqv), which verify
# signatures but do not print a key's fingerprint. Pure functions; RFC 9580 (and 4880) packet
# framing and fingerprint rules, nothing else of OpenPGP.
"""OpenPGP public key fingerprints (RFC 9580 section 5.5.4)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

PUBLIC_KEY_TAG = 6
# signature, public key, user ID, public subkey, user attribute
KEY_FILE_TAGS = frozenset((2, 6, 13, 14, 17))
ARMOR_RE = re.compile(
    rb"-----BEGIN PGP PUBLIC KEY BLOCK-----\r?\n(.*?)\r?\n-----END PGP PUBLIC KEY BLOCK-----", re.S)
FINGERPRINT_RE = re.compile(r"^(?:[0-9A-F]{40}|[0-9A-F]{64})$")


class KeyFileError(ValueError):
    """Bytes that are not an OpenPGP public key file."""


def normalise_fingerprint(text):
    """`9DC8 5822 ...` or `0x9dc8...` -> `9DC85822...`; KeyFileError unless 40 or 64 hex digits."""
    value = re.sub(r"\s+", "", str(text)).upper()
    value = value[2:] if value.startswith("0X") else value
    if not FINGERPRINT_RE.match(value):
        raise KeyFileError("%r is not an OpenPGP fingerprint (40 hex digits for a v4 key, 64 for v6)" % text)
    return value


def dearmor(data):
    """The binary packets of an armored key file (every armored block, in order), or `data`
    itself when it is already binary. The armor checksum, where present, must match.

    Every byte must belong to a block headed exactly `-----BEGIN PGP PUBLIC KEY BLOCK-----`
    (whitespace between blocks aside): apt's own dearmoring is laxer than this and trusts a key in
    a block whose BEGIN line has a trailing blank or another label (MESSAGE, ARMORED FILE), so a
    file that carries one beside the pinned key is refused, not read around."""
    if not data.lstrip().startswith(b"-----BEGIN"):
        return data
    blocks = list(ARMOR_RE.finditer(data))
    if not blocks:
        raise KeyFileError("armored text without a complete PUBLIC KEY BLOCK")
    outside = b"".join(data[end:start] for end, start in zip(
        [0] + [m.end() for m in blocks], [m.start() for m in blocks] + [len(data)]))
    if outside.strip():
        first = outside.strip().split(b"\n")[0][:60]
        raise KeyFileError("the file holds text outside its PUBLIC KEY BLOCKs (%r): apt would read a key "
                           "from it that no pin checked" % first)
    out = b""
    for match in blocks:
        lines = match.group(1).replace(b"\r", b"").split(b"\n")
        # armor headers (e.g. Comment:) end at the first blank line
        if b"" in lines and any(b": " in line for line in lines[:lines.index(b"")]):
            lines = lines[lines.index(b"") + 1:]
        body = [line.strip() for line in lines if line.strip()]
        crc = None
        if body and body[-1].startswith(b"=") and len(body[-1]) == 5:
            crc = body.pop()
        try:
            packets = base64.b64decode(b"".join(body), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise KeyFileError("armored key is not valid base64: %s" % exc)
        if crc is not None and base64.b64decode(crc[1:]) != crc24(packets).to_bytes(3, "big"):
            raise KeyFileError("armor checksum does not match the key's bytes (a corrupted or edited key)")
        out += packets
    return out


def armor(packets_data):
    """The ASCII armor of binary key packets (RFC 9580 section 6.2), as `gpg --armor --export`
    writes it: 64 base64 characters a line, the CRC-24 checksum, no headers."""
    text = base64.b64encode(packets_data)
    lines = [text[i:i + 64] for i in range(0, len(text), 64)]
    return (b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n" + b"\n".join(lines) + b"\n="
            + base64.b64encode(crc24(packets_data).to_bytes(3, "big"))
            + b"\n-----END PGP PUBLIC KEY BLOCK-----\n")


def crc24(data):
    """The armor checksum (RFC 9580 section 6.1)."""
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def packets(data):
    """(tag, body) of every packet, old and new framing; KeyFileError on a truncated packet."""
    at, out = 0, []
    while at < len(data):
        head = data[at]
        if not head & 0x80:
            raise KeyFileError("byte %d is not a packet header" % at)
        if head & 0x40:  # new format
            tag, at = head & 0x3F, at + 1
            if at >= len(data):
                raise KeyFileError("truncated packet header at byte %d" % at)
            first = data[at]
            if first < 192:
                length, at = first, at + 1
            elif first < 224:
                if at + 1 >= len(data):
                    raise KeyFileError("truncated packet length at byte %d" % at)
                length, at = ((first - 192) << 8) + data[at + 1] + 192, at + 2
            elif first == 255:
                length, at = int.from_bytes(data[at + 1:at + 5], "big"), at + 5
            else:
                raise KeyFileError("partial body lengths do not occur in key files (byte %d)" % at)
        else:  # old format
            tag, kind, at = (head >> 2) & 0x0F, head & 0x03, at + 1
            if kind == 3:
                raise KeyFileError("indeterminate packet length at byte %d" % at)
            size = (1, 2, 4)[kind]
            length, at = int.from_bytes(data[at:at + size], "big"), at + size
        if at + length > len(data):
            raise KeyFileError("packet at byte %d runs past the end of the file" % at)
        out.append((tag, data[at:at + length]))
        at += length
    return out


def fingerprint(body):
    """Fingerprint of a public-key packet body: v4 SHA-1 over 0x99 + 2-byte length + body;
    v6 SHA-256 over 0x9B + 4-byte length + body (v5, the draft, 0x9A)."""
    if not body:
        raise KeyFileError("empty public-key packet")
    version = body[0]
    if version == 4:
        return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()
    if version in (5, 6):
        prefix = b"\x9a" if version == 5 else b"\x9b"
        return hashlib.sha256(prefix + len(body).to_bytes(4, "big") + body).hexdigest().upper()
    raise KeyFileError("public key version %d is not supported (v4, v5 and v6 are)" % version)


def checked_key(data):
    """(binary packets, primary fingerprints) of a public key file whose every packet belongs to a
    transferable public key (RFC 9580 section 10.1: a primary key first, then user IDs and
    attributes, subkeys and their signatures); KeyFileError on anything else. The packets are
    what a keyring written from this file may hold: nothing the check did not read."""
    data = dearmor(data)
    parsed = packets(data)
    if not parsed:
        raise KeyFileError("no public key in the file")
    if parsed[0][0] != PUBLIC_KEY_TAG:
        raise KeyFileError("the file starts with a packet of type %d, not a public key" % parsed[0][0])
    other = sorted({tag for tag, _ in parsed} - KEY_FILE_TAGS)
    if other:
        raise KeyFileError("the file holds packet type(s) %s, which a public key file does not"
                           % ", ".join(str(t) for t in other))
    return data, [fingerprint(body) for tag, body in parsed if tag == PUBLIC_KEY_TAG]


def pin_problem(found, pinned):
    """Why a key file whose primary keys are `found` may not be trusted against `pinned`, or
    None: every primary key must be pinned (an extra key in the file would be trusted too)."""
    unpinned = [f for f in found if f not in pinned]
    if unpinned:
        return "primary key(s) %s not pinned (pinned: %s)" % (", ".join(unpinned), ", ".join(pinned) or "none")
    return None
