"""The certificate serve's HTTPS port uses: the user's own (by setting), or one made here once.

kubectl sends its bearer token only over TLS, so the API needs HTTPS even on one's own
machine. Unless OCCVIZ_TLS_CERT and OCCVIZ_TLS_KEY name a certificate and key (PEM),
the first process that needs one makes a certificate authority and a server certificate
for 127.0.0.1 and localhost in DATA_DIR/tls, and every later start reuses them, so a
kubeconfig made once (`manage.py kubeconfig`, which carries the CA) keeps working.
The CA's key signs the server certificate and is then thrown away: trusting this CA
trusts nothing but this server.
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import ipaddress
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from twisted.internet.endpoints import quoteStringArgument

TLS_DIR = "tls"
CA_FILE = "ca.pem"
CERT_FILE = "server.pem"
KEY_FILE = "server-key.pem"
# Long enough never to expire under a course; nothing but these kubeconfigs trusts the CA.
VALID_FOR = datetime.timedelta(days=3650)
SERVER_NAMES: list[x509.GeneralName] = [
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    x509.DNSName("localhost"),
]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the server's certificate, its key, and the CA a client should trust (None: its own)."""

    certificate: Path
    key: Path
    authority: Path | None


def tls_files() -> TlsFiles:
    """The files the settings name, checked; unset, the ones in DATA_DIR/tls, made on first use."""
    own = configured_files(settings.OCCVIZ_TLS_CERT, settings.OCCVIZ_TLS_KEY, settings.OCCVIZ_TLS_CA)
    return own or generated_files(Path(settings.DATA_DIR))


def configured_files(certificate: str, key: str, authority: str) -> TlsFiles | None:
    """The user's own certificate, key and CA, each read and checked; None if none is set."""
    if not (certificate or key or authority):
        return None
    if not (certificate and key):
        missing = "OCCVIZ_TLS_KEY" if certificate else "OCCVIZ_TLS_CERT"
        raise ImproperlyConfigured(
            f"{missing} is not set: give OCCVIZ_TLS_CERT and OCCVIZ_TLS_KEY together (and OCCVIZ_TLS_CA if a "
            "CA of your own signed the certificate), or none of them for a certificate made in the data folder."
        )
    certificate_path, key_path = _readable("OCCVIZ_TLS_CERT", certificate), _readable("OCCVIZ_TLS_KEY", key)
    chain = _certificates("OCCVIZ_TLS_CERT", certificate_path)
    private_key = _private_key("OCCVIZ_TLS_KEY", key_path)
    if private_key.public_key() != chain[0].public_key():
        raise ImproperlyConfigured(
            f"OCCVIZ_TLS_KEY ({key_path}) is not the key of the certificate in OCCVIZ_TLS_CERT ({certificate_path})."
        )
    authority_path = None
    if authority:
        authority_path = _readable("OCCVIZ_TLS_CA", authority)
        _certificates("OCCVIZ_TLS_CA", authority_path)
    return TlsFiles(certificate_path, key_path, authority_path)


def _readable(setting: str, value: str) -> Path:
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise ImproperlyConfigured(f"{setting}={value!r}: there is no file {path}.")
    if not os.access(path, os.R_OK):
        raise ImproperlyConfigured(f"{setting}={value!r}: {path} cannot be read by this user.")
    return path


def _certificates(setting: str, path: Path) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except ValueError:
        raise ImproperlyConfigured(f"{setting}: {path} holds no PEM certificate (BEGIN CERTIFICATE).") from None


def _private_key(setting: str, path: Path) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(path.read_bytes(), password=None)
    except TypeError:  # it asks for a passphrase that no one will be there to type
        raise ImproperlyConfigured(f"{setting}: {path} is encrypted; give the key without a passphrase.") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ImproperlyConfigured(f"{setting}: {path} holds no PEM private key.") from None


def generated_files(data_dir: Path) -> TlsFiles:
    """DATA_DIR/tls, made now if it does not exist yet.

    Processes that start together may each make a set: each writes its own into a private
    temporary folder and renames it to `tls`, which fails once the name exists, so the
    first rename wins and everyone uses the winner's files, never a half-written set.
    """
    folder = data_dir / TLS_DIR
    if not folder.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        draft = Path(tempfile.mkdtemp(dir=data_dir, prefix=f".{TLS_DIR}."))  # mode 0700
        try:
            _write_authority_and_certificate(draft)
            try:
                draft.rename(folder)
            except OSError as error:  # another process got there first: its files are the files
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            shutil.rmtree(draft, ignore_errors=True)
    files = TlsFiles(folder / CERT_FILE, folder / KEY_FILE, folder / CA_FILE)
    for path in (files.certificate, files.key, files.authority):
        assert path is not None
        if not path.is_file():
            raise ImproperlyConfigured(f"{path} is missing: delete {folder} to have a new certificate made.")
    return files


def _write_authority_and_certificate(folder: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    # An hour back: a client whose clock runs a little behind must not see a certificate from the future.
    start, end = now - datetime.timedelta(hours=1), now + VALID_FOR
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "occviz"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"occviz local CA {secrets.token_hex(4)}"),
        ]
    )
    ca_key_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign_certificates=True), critical=True)
        .add_extension(ca_key_id, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(SERVER_NAMES), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (folder / CA_FILE).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / CERT_FILE).write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(folder / KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(key_pem)


def _key_usage(*, sign_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certificates,
        crl_sign=sign_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def fingerprint(certificate: Path) -> str:
    """The SHA-256 fingerprint of the first certificate in a PEM file, as `openssl x509 -fingerprint` shows it."""
    der = x509.load_pem_x509_certificates(certificate.read_bytes())[0].public_bytes(serialization.Encoding.DER)
    return ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


# Connections the kernel holds for the web server before it accepts them. Daphne's `-b/-p` listen with
# Twisted's 50: a class opening 300 pages at once overflowed it, and each connection dropped waited for
# its client's SYN to be sent again, a second later (hellos at 2.5 s and more where they took 1.6 s).
LISTEN_BACKLOG = 1024


def http_endpoint(host: str, port: int) -> str:
    """Daphne's `-e` endpoint string for HTTP on host:port, with room for a class arriving at once."""
    return f"tcp:port={port}:interface={quoteStringArgument(host.strip('[]'))}:backlog={LISTEN_BACKLOG}"


def daphne_endpoint(files: TlsFiles, host: str, port: int) -> str:
    """Daphne's `-e` endpoint string for HTTPS on host:port with these files (colons in paths escaped)."""
    return (
        f"ssl:port={port}:interface={quoteStringArgument(host.strip('[]'))}:backlog={LISTEN_BACKLOG}"
        f":privateKey={quoteStringArgument(str(files.key))}:certKey={quoteStringArgument(str(files.certificate))}"
    )
