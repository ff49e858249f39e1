"""The embedded store's secrets, which keep its ports closed to other local processes.

- The S3 key pair its gateway accepts (its only identity): made on the store's first start,
  kept in ``keys/s3-credentials.json`` and used again at every later start.
- The JWT signing keys the volume server and the filer check on every read and write over
  HTTP, and the certificates of the mutual TLS every gRPC port asks for (a CA of its own and
  one certificate, which every component serves and dials with): made afresh at each start
  (nothing signed with them outlives the process), written to ``keys/security.toml``.

``keys/`` is 0700 and every file in it 0600; ``weed`` is pointed at it with ``-config_dir``.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
import string
from dataclasses import dataclass
from pathlib import Path

from cellactors.errors import ConfigError
from cellactors.persistence.files import private_dir, write_private_file

KEYS_DIR = "keys"
CREDENTIALS_FILE = "s3-credentials.json"
S3_CONFIG_FILE = "s3.json"
SECURITY_FILE = "security.toml"
_CA_CERT = "grpc-ca.crt"
_CERT = "grpc.crt"
_KEY = "grpc.key"
# Every gRPC component of ``weed mini``, as a server, and ``client`` as what dials them
# (``weed shell`` included).
_GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin", "worker", "client")
_JWT_SECTIONS = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
_S3_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")
_ALNUM = string.ascii_uppercase + string.digits


@dataclass(frozen=True)
class S3Credentials:
    """An S3 access key pair."""

    access_key_id: str
    secret_access_key: str


def make_credentials() -> S3Credentials:
    """A fresh random key pair (an AWS-shaped 20-character id, a 40-character secret)."""
    key_id = "CA" + "".join(secrets.choice(_ALNUM) for _ in range(18))
    return S3Credentials(key_id, secrets.token_urlsafe(30))


def load_or_make_credentials(keys: Path, given: S3Credentials | None = None) -> S3Credentials:
    """The store's key pair: ``given`` when given (kept, replacing the file's), else the one
    kept in ``keys``, else a new one (kept)."""
    path = keys / CREDENTIALS_FILE
    if given is None and path.exists():
        try:
            saved = json.loads(path.read_text())
            return S3Credentials(str(saved["access_key_id"]), str(saved["secret_access_key"]))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(
                f"the embedded store's credentials in {path} are unreadable: {err}"
            ) from err
    creds = given or make_credentials()
    body = {"access_key_id": creds.access_key_id, "secret_access_key": creds.secret_access_key}
    write_private_file(path, json.dumps(body, indent=2).encode() + b"\n")
    return creds


def prepare_keys(data_dir: Path, given: S3Credentials | None = None) -> tuple[Path, S3Credentials]:
    """Make ``data_dir/keys`` (0700) with everything ``weed`` needs to close its ports; the
    folder (for ``-config_dir``) and the S3 key pair its gateway accepts."""
    keys = private_dir(data_dir / KEYS_DIR)
    creds = load_or_make_credentials(keys, given)
    identities = {
        "identities": [
            {
                "name": "cellactors",
                "credentials": [
                    {"accessKey": creds.access_key_id, "secretKey": creds.secret_access_key}
                ],
                "actions": list(_S3_ACTIONS),
            }
        ]
    }
    write_private_file(keys / S3_CONFIG_FILE, json.dumps(identities, indent=2).encode())
    _write_certificates(keys)
    write_private_file(keys / SECURITY_FILE, security_toml(keys).encode())
    return keys, creds


def security_toml(keys: Path) -> str:
    """``security.toml``: fresh JWT keys for every HTTP read and write of the volume server
    and the filer, mutual TLS on every gRPC port, and no volume UI or directory listing."""
    lines = ["[access]", "ui = false", "", "[filer.expose_directory_metadata]", "enabled = false"]
    for section in _JWT_SECTIONS:
        lines += ["", f"[{section}]", f'key = "{secrets.token_hex(32)}"']
        lines += ["expires_after_seconds = 10"]
    lines += ["", "[grpc]", f"ca = {_toml_path(keys / _CA_CERT)}"]
    for component in _GRPC_COMPONENTS:
        lines += ["", f"[grpc.{component}]", f"cert = {_toml_path(keys / _CERT)}"]
        lines += [f"key = {_toml_path(keys / _KEY)}"]
    return "\n".join(lines) + "\n"


def _toml_path(path: Path) -> str:
    return json.dumps(str(path))  # a JSON string is a TOML basic string


def _write_certificates(keys: Path) -> None:
    """A CA and one certificate it signs (for both ends of every gRPC connection; SeaweedFS
    does not check host names), with their keys."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=3650)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cellactors embedded store CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cellactors")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    write_private_file(keys / _CA_CERT, ca_cert.public_bytes(pem))
    write_private_file(keys / _CERT, cert.public_bytes(pem))
    write_private_file(
        keys / _KEY,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
