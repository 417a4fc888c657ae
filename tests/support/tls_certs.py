"""Certificates for the TLS tests, made on the spot with `cryptography`: a CA, a server certificate for
127.0.0.1 and localhost, client certificates (signed by that CA, by another CA, or already expired),
each written as PEM files a config's `services.tls` can name.

    pki = Pki.create(tmp_path)
    server = pki.server()              # Cert(cert_file, key_file)
    both = pki.server("both", client_too=True)
    client = pki.client("trainer")
    expired = pki.client("old", expired=True)
    stranger = Pki.create(tmp_path / "other").client("mallory")
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class Cert:
    """A certificate and its private key, as PEM files."""

    cert_file: Path
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


@dataclass(frozen=True)
class Pki:
    """A certificate authority in `folder` (`ca.pem`) that signs server and client certificates."""

    folder: Path
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @classmethod
    def create(cls, folder: Path, name: str = "RFT Mesh test CA") -> Pki:
        folder.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY)
            .not_valid_after(now + 30 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            )  # fmt: skip
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        pki = cls(folder, key, cert)
        pki.ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pki

    def _issue(
        self,
        stem: str,
        common_name: str,
        *,
        server: bool,
        expired: bool,
        client: bool = True,
        names: Sequence[str] = (),
    ) -> Cert:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        start, end = (now - 10 * DAY, now - DAY) if expired else (now - DAY, now + 30 * DAY)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usage += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()), critical=False
            )
        )
        if server:
            sans = [x509.DNSName(n) for n in ("localhost", *names)]
            sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        out = Cert(self.folder / f"{stem}.pem", self.folder / f"{stem}.key")
        out.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, out.key_file)
        return out

    def server(
        self,
        stem: str = "server",
        *,
        expired: bool = False,
        client_too: bool = False,
        names: Sequence[str] = (),
    ) -> Cert:
        """A server certificate for 127.0.0.1, localhost and the DNS `names` (e.g. compose service names);
        `client_too`: also usable as a client's (extended key usage serverAuth and clientAuth), one
        certificate for both ends of a service."""
        return self._issue(stem, "localhost", server=True, expired=expired, client=client_too, names=names)

    def client(self, common_name: str = "client", *, expired: bool = False) -> Cert:
        """A client certificate (`CN=common_name`), expired a day ago with `expired=True`."""
        return self._issue(f"client-{common_name}", common_name, server=False, expired=expired)
