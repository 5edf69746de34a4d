"""How to reach the kernel: its address, TLS settings and API key, as one grpcio channel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class Tls:
    """How to reach a kernel started with `--tls-cert` and `--tls-key`: the CA certificates that
    signed the kernel's certificate (PEM), optionally a client certificate and key to present (for
    a kernel started with `--tls-client-ca`), and a name to check the kernel's certificate against
    instead of the address's host.

    With TLS settings an address without a scheme means `https://`; an `http://` address with
    them is refused.
    """

    ca_pem: bytes | None = None
    """`None` trusts the system's roots."""
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    domain_name: str | None = None

    @classmethod
    def from_files(
        cls,
        ca: str | Path | None = None,
        *,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        domain_name: str | None = None,
    ) -> Tls:
        """Reads the PEM files; a missing file's error names it."""

        def read(path: str | Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        if (cert is None) != (key is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        return cls(read(ca), read(cert), read(key), domain_name)


def target(address: str, tls: Tls | None) -> tuple[str, bool]:
    """The `host:port` to dial and whether to use TLS, from `host:port`, `http://` or `https://`."""
    if address.startswith("https://"):
        return address.removeprefix("https://").rstrip("/"), True
    if address.startswith("http://"):
        if tls is not None:
            raise ValueError(f"kernel address '{address}' is http:// but TLS settings were given")
        return address.removeprefix("http://").rstrip("/"), False
    if "://" in address:
        raise ValueError(f"kernel address '{address}': use host:port, http:// or https://")
    if ":" not in address:
        raise ValueError(f"kernel address '{address}' has no port")
    return address, tls is not None


def channel(address: str, tls: Tls | None) -> grpc.aio.Channel:
    """An asyncio channel to the kernel (connected lazily, on its first call)."""
    host, secure = target(address, tls)
    # Keepalives find a dead connection within seconds even when nothing flows.
    options: list[tuple[str, int | str]] = [
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ]
    if not secure:
        return grpc.aio.insecure_channel(host, options=options)
    settings = tls or Tls()
    if settings.domain_name:
        options.append(("grpc.ssl_target_name_override", settings.domain_name))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=settings.ca_pem,
        private_key=settings.key_pem,
        certificate_chain=settings.cert_pem,
    )
    return grpc.aio.secure_channel(host, credentials, options=options)


def metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """The request metadata carrying the API key, when there is one."""
    if api_key is None:
        return ()
    if not api_key.strip() or any(c in api_key for c in "\r\n"):
        raise ValueError("the API key is empty or holds a line break")
    return (("authorization", f"Bearer {api_key.strip()}"),)
