"""TLS of the clients of a coordinator (workers, the operator CLI): which CA to trust, and the site's
own certificate under mutual TLS. Read from the environment so that every way of starting a worker
or the CLI takes the same settings:

- ``FEDPROMPT_CA_FILE``: PEM CA certificate(s) the coordinator's certificate is verified against (a
  private CA of the federation); unset: the system's trust store.
- ``FEDPROMPT_CLIENT_CERT_FILE`` and ``FEDPROMPT_CLIENT_KEY_FILE``: the site's certificate and key,
  presented when the coordinator asks (mutual TLS); both or neither.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

CA_FILE = "FEDPROMPT_CA_FILE"
CERT_FILE = "FEDPROMPT_CLIENT_CERT_FILE"
KEY_FILE = "FEDPROMPT_CLIENT_KEY_FILE"


class TLSConfigError(ValueError):
    """A TLS setting that cannot work, in one line naming the setting."""


@dataclass(frozen=True)
class ClientTLS:
    """The CA to verify the coordinator with and the certificate to present, if any."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientTLS:
        env = os.environ if env is None else env
        values = {name: env.get(name) or None for name in (CA_FILE, CERT_FILE, KEY_FILE)}
        if (values[CERT_FILE] is None) != (values[KEY_FILE] is None):
            raise TLSConfigError(f"{CERT_FILE} and {KEY_FILE} go together: set both or neither")
        for name, value in values.items():
            if value is not None and not Path(value).is_file():
                raise TLSConfigError(f"{name}={value}: no such file")
        ca, cert, key = (Path(v) if v else None for v in values.values())
        return cls(ca, cert, key)

    def verify(self) -> ssl.SSLContext:
        """httpx's ``verify``: the process's one default context (httpx's trust store), or a context with
        the CA and certificate."""
        if self.ca_file is None and self.cert_file is None:
            return default_context()
        try:
            context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            if self.cert_file is not None:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(
                f"the TLS files could not be loaded ({CA_FILE}, {CERT_FILE}, {KEY_FILE}): {exc}"
            ) from None
        return context


@functools.cache
def default_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process: httpx builds one for every client
    (loading the whole trust store, about 0.9 MiB each), and a worker pool runs a client per site."""
    return httpx.create_ssl_context()
