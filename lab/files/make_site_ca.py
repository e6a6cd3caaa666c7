#!/usr/bin/env python3
"""The lab's site CA: a CA certificate and a gateway certificate signed by it (ECDSA P-256).

A real site uses its own CA and hands the gateway role gateway_tls_cert_pem/gateway_tls_key_pem;
the lab (lab/up.yml) and the gateway tests make theirs with this script, once, with the
`cryptography` package that ansible-core already depends on.

    make_site_ca.py OUT_DIR NAME [NAME ...]   (DNS names or IP addresses for the gateway cert)

Writes OUT_DIR/ca.pem, OUT_DIR/ca.key (0600), OUT_DIR/gateway.pem, OUT_DIR/gateway.key (0600);
existing files are kept (idempotent), so a rerun never rotates the lab's certificates.
Options: --days N (validity, default 825), --expired (a certificate that expired yesterday,
for the refusal test).
"""
import argparse
import datetime
import ipaddress
import os
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(path, data, mode):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def _key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make(out, names, days=825, expired=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = (now - datetime.timedelta(days=30), now - datetime.timedelta(days=1)) if expired \
        else (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mm3 lab site CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    os.makedirs(out, exist_ok=True)
    pem = serialization.Encoding.PEM
    _write(os.path.join(out, "ca.pem"), ca.public_bytes(pem), 0o644)
    _write(os.path.join(out, "ca.key"), _key_pem(ca_key), 0o600)
    _write(os.path.join(out, "gateway.pem"), cert.public_bytes(pem), 0o644)
    _write(os.path.join(out, "gateway.key"), _key_pem(key), 0o600)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("names", nargs="+")
    parser.add_argument("--days", type=int, default=825)
    parser.add_argument("--expired", action="store_true")
    args = parser.parse_args(argv)
    if os.path.exists(os.path.join(args.out, "gateway.key")):
        print("site CA in %s exists; kept" % args.out)
        return 0
    make(args.out, args.names, args.days, args.expired)
    print("site CA and gateway certificate written to %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
