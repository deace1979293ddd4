"""A throw-away certificate authority, made at test time, for the signing tests.

The signing tests need a private key and a certificate chain. The skill's own key never
enters the repository, so the tests make their own chain in a temporary folder: a root CA,
an intermediate CA and a leaf for signing, shaped like the chain that signs releases
(ECDSA P-384; the CAs with ``CA:TRUE`` and ``keyCertSign``, the intermediate with
``pathlen:0``, the leaf with ``CA:FALSE`` and ``digitalSignature``). Nothing made here
is trusted by anything but the test that made it.

Needs ``cryptography``, which ``model-signing`` and ``pyopenssl`` (the ``sign`` extra)
depend on.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LEAF_NAME = "Test Skill Signing Leaf"
ORG = "nemo-mbridge-perf-megatron-fsdp tests"
VALID_DAYS = 2  # long enough for a test run, short enough to be useless elsewhere


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG), x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not sign_certs,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        encipher_only=False,
        decipher_only=False,
    )


def _cert(subject: str, key, issuer: x509.Name, issuer_key, *, ca: bool, pathlen: int | None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=pathlen), critical=True)
        .add_extension(_usage(sign_certs=ca), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )
    return builder.sign(issuer_key, hashes.SHA384())


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def make_chain(folder: Path, label: str = "Test") -> dict:
    """Root, intermediate and leaf under ``folder``; returns the paths as the signing tests use them."""
    folder.mkdir(parents=True, exist_ok=True)
    root_key = ec.generate_private_key(ec.SECP384R1())
    ica_key = ec.generate_private_key(ec.SECP384R1())
    leaf_key = ec.generate_private_key(ec.SECP384R1())
    root = _cert(f"{label} Root CA", root_key, _name(f"{label} Root CA"), root_key, ca=True, pathlen=None)
    ica = _cert(f"{label} Intermediate CA", ica_key, root.subject, root_key, ca=True, pathlen=0)
    leaf = _cert(LEAF_NAME, leaf_key, ica.subject, ica_key, ca=False, pathlen=None)
    key_path = folder / "leaf.key.pem"
    key_path.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return {
        "key": key_path,
        "cert": _write_cert(folder / "leaf.crt.pem", leaf),
        "chain": [_write_cert(folder / "ica.crt.pem", ica), _write_cert(folder / "root.crt.pem", root)],
        "root": folder / "root.crt.pem",
        "signer": LEAF_NAME,
    }
