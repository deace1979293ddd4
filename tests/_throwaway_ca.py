"""A throw-away certificate chain, made at test time, in the shape of the maintainers' real one.

Root CA -> intermediate CA (pathlen 0) -> leaf (digitalSignature), ECDSA P-384 with SHA-384, as in
``signing/root.crt.pem``. Signing tests use it, so they run in a clean clone without the maintainers' key;
the private keys live in pytest's temporary folder and are never written into the repository.
"""

from __future__ import annotations

import datetime
from pathlib import Path

ORG = "throw-away test CA"


def make_chain(folder: Path, leaf_cn: str = "Skill Signing 001") -> dict:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=2)

    def name(cn: str) -> x509.Name:
        return x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG), x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        )

    def cert(subject, subject_key, issuer, issuer_key, ca: bool, pathlen=None):
        usage = dict(
            digital_signature=not ca,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=ca,
            crl_sign=ca,
            encipher_only=False,
            decipher_only=False,
        )
        b = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(subject_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=pathlen), critical=True)
            .add_extension(x509.KeyUsage(**usage), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(subject_key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
        )
        return b.sign(issuer_key, hashes.SHA384())

    keys = {n: ec.generate_private_key(ec.SECP384R1()) for n in ("root", "ica", "leaf")}
    root_name, ica_name = name("Test Root CA"), name("Test Intermediate CA")
    certs = {
        "root": cert(root_name, keys["root"], root_name, keys["root"], True),
        "ica": cert(ica_name, keys["ica"], root_name, keys["root"], True, 0),
        "leaf": cert(name(leaf_cn), keys["leaf"], ica_name, keys["ica"], False),
    }
    out = {}
    for n, c in certs.items():
        p = folder / f"{n}.crt.pem"
        p.write_bytes(c.public_bytes(serialization.Encoding.PEM))
        out[n] = p
    key = folder / "leaf.key.pem"
    key.write_bytes(
        keys["leaf"].private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return {"key": key, "cert": out["leaf"], "chain": [out["ica"], out["root"]], "root": out["root"]}
