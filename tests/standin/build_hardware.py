#!/usr/bin/env python3
"""Build a node's stand-in PCI hardware from a RECORDED machine (tests/fixtures/hardware/*.yml,
passed here as JSON): what the real tools read, so the roles' real commands run on it.

STAND-IN (tests only). No GPU, NVSwitch or ConnectX exists on the build machines. This writes

- OUT/lspci.dump: a config-space dump in the format of `lspci -x`, one function per recorded
  `lspci -Dnn` line (vendor, device, revision, class), which the REAL lspci reads with
  `lspci -F OUT/lspci.dump` and prints with the node's own pci.ids;
- OUT/devices/<domain:bus:dev.fn>/vpd: each ConnectX function's PCI Vital Product Data in the
  binary format of PCI Local Bus 3.0 section 6.4 (identifier string, VPD-R keywords with the RV
  checksum, end tag), holding the recorded fields (SMDL=SW_MNG on a bridge function), which the
  roles grep as they would /sys/bus/pci/devices/<function>/vpd.

usage: build_hardware.py MACHINE.json OUT_DIR      (stdlib only: runs on the test node)
"""
import json
import os
import re
import sys

LINE = re.compile(r"^(?P<address>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+.*?\[(?P<cls>[0-9a-fA-F]{4})\]:"
                  r".*\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\](?:\s+\(rev (?P<rev>[0-9a-fA-F]{2})\))?")


def config_space(vendor, device, cls, rev):
    """The 64-byte type-0 header: IDs, status (capabilities list), revision, class code."""
    data = bytearray(64)
    data[0:2] = int(vendor, 16).to_bytes(2, "little")
    data[2:4] = int(device, 16).to_bytes(2, "little")
    data[6:8] = (0x0010).to_bytes(2, "little")
    data[8] = int(rev or "00", 16)
    data[10] = int(cls[2:], 16)   # subclass
    data[11] = int(cls[:2], 16)   # base class
    return data


def dump(lines):
    out = []
    for line in lines:
        match = LINE.match(line.strip())
        if not match:
            continue
        address = match["address"] if len(match["address"]) > 7 else "0000:" + match["address"]
        data = config_space(match["vendor"], match["device"], match["cls"], match["rev"])
        out.append("%s stand-in" % address.lower())
        for offset in range(0, len(data), 16):
            out.append("%02x: %s" % (offset, " ".join("%02x" % b for b in data[offset:offset + 16])))
    return "\n".join(out) + "\n"


def vpd(ident, fields):
    """PCI VPD: 0x82 identifier string, 0x90 VPD-R (keyword, length, value ...; RV closes it with a
    checksum that makes the sum of all bytes so far zero), 0x78 end tag."""
    ident = ident.encode()
    out = bytearray([0x82]) + len(ident).to_bytes(2, "little") + ident
    body = bytearray()
    for key, value in fields.items():
        value = str(value).encode()
        body += key.encode()[:2] + bytes([len(value)]) + value
    body += b"RV" + bytes([1])
    start = len(out)
    out += bytes([0x90]) + (len(body) + 1).to_bytes(2, "little") + body
    out.append((-sum(out[:start] + out[start:])) & 0xFF)
    out.append(0x78)
    return bytes(out)


def main(machine_json, out):
    with open(machine_json) as fh:
        machine = json.load(fh)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "lspci.dump"), "w") as fh:
        fh.write(dump(machine["lspci"].splitlines()))
    for address, fields in (machine.get("vpd") or {}).items():
        path = os.path.join(out, "devices", address.lower())
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "vpd"), "wb") as fh:
            fh.write(vpd("NVIDIA ConnectX-7 (stand-in)", fields or {}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
