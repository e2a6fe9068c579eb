"""The HTTP server: uvicorn with the connection limits of the settings.

uvicorn bounds an idle kept-alive connection (``timeout_keep_alive``), the connections and requests
in progress (``limit_concurrency``: past it, 503) and, with its h11 parser, the size of a request's
head (``h11_max_incomplete_event_size``). It does not bound how long a client may take to send a
request's line and headers, and its httptools parser (the one used here, for speed) does not bound
their size: a connection that opens and trickles a header a byte a minute is held forever.
``guarded_protocol`` adds both to the httptools protocol: the head must be complete within
FEDPROMPT_HEADER_TIMEOUT_S of the request's first byte (of the connection's opening, for its first
request), else the connection is answered 408 and closed; a head over FEDPROMPT_MAX_HEADER_BYTES is
answered 431 and closed. The body's own deadline is the ASGI middleware's (api/body_limit.py) while
a route reads it. A request answered before its body arrived (a 429, a 401 to an upload) is another
gap: uvicorn stops its keep-alive clock whenever bytes arrive and never restarts it, so a client that
sends all but the last byte of such a body held the connection forever. Here what is left of it
must arrive within FEDPROMPT_BODY_TIMEOUT_S of the answer, else the connection is closed, and the
keep-alive clock starts again once it has.

Liveness is answered past the concurrency limit: a request for ``/healthz`` goes to the app even when
``limit_concurrency`` connections are open, so a flood of idle or slow connections (answered 503 on
every other path until the head deadline cuts them) cannot fail a liveness probe and restart a pod
that is only busy. ``/healthz`` does no I/O and runs on the event loop. Readiness (``/readyz``) stays
under the limit: a flooded replica should leave the load balancer's rotation, not be restarted. There
is no per-address connection cap: behind a reverse proxy every connection has the proxy's address.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from fedprompt.coordinator.config import Settings

try:  # uvicorn's compiled parser: a dependency of the package, but keep the pure-Python fallback
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover
    HttpToolsProtocol = None  # type: ignore[assignment,misc]  # no compiled parser: the fallback below


# Paths answered even past uvicorn's limit_concurrency (see the module's docstring).
UNLIMITED_PATHS = frozenset({b"/healthz"})


def _response(status: int, reason: str) -> bytes:
    return f"HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode("ascii")


def guarded_protocol(
    header_timeout_s: float, max_header_bytes: int, body_timeout_s: float = 60.0
) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol with deadlines for a request's head and for the rest of a body
    answered early, and a cap on the head's size."""
    if HttpToolsProtocol is None:  # pragma: no cover
        return None

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        header_timeout = header_timeout_s
        body_timeout = body_timeout_s
        max_head = max_header_bytes

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer: asyncio.TimerHandle | None = None
            self._tls: dict[object, object] | None = None
            self._rest_timer: asyncio.TimerHandle | None = None
            self._head_bytes = 0
            self._refused = False

        # -- the head's deadline ----------------------------------------------------------------

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            self._refuse(408, "Request Timeout")

        def _refuse(self, status: int, reason: str) -> None:
            self._refused = True
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(_response(status, reason))
                self.transport.close()

        # -- the rest of a body answered before it arrived ----------------------------------------

        def _cancel_rest(self) -> None:
            if self._rest_timer is not None:
                self._rest_timer.cancel()
                self._rest_timer = None

        def _rest_too_slow(self) -> None:
            self._rest_timer = None
            if not self.transport.is_closing():
                self.transport.close()  # answered already: nothing more to say

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.cycle is not None and self.cycle.more_body and not self.transport.is_closing():
                self._cancel_rest()
                self._rest_timer = self.loop.call_later(self.body_timeout, self._rest_too_slow)

        # uvicorn hands its protocols a TCP connection's asyncio.Transport (typed BaseTransport upstream)
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._tls = tls_extension(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._cancel_rest()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            super().data_received(data)

        # -- parser callbacks: count the head, start and stop its clock ---------------------------

        def on_message_begin(self) -> None:
            if self._refused:
                return
            self._head_bytes = 0
            self._arm()  # the idle time before it was the keep-alive timeout's
            super().on_message_begin()
            if self._tls is not None:  # the ASGI TLS extension: the client's certificate, if it sent one
                self.scope["extensions"] = {**self.scope.get("extensions", {}), "tls": self._tls}

        def _count(self, n: int) -> bool:
            self._head_bytes += n
            if self._head_bytes > self.max_head:
                self._refuse(431, "Request Header Fields Too Large")
            return not self._refused

        def on_url(self, url: bytes) -> None:
            if not self._refused and self._count(len(url)):
                super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if not self._refused and self._count(len(name) + len(value) + 4):
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._disarm()
            if self.url.split(b"?", 1)[0] in UNLIMITED_PATHS and self.limit_concurrency is not None:
                limit, self.limit_concurrency = self.limit_concurrency, None
                try:
                    super().on_headers_complete()
                finally:
                    self.limit_concurrency = limit
            else:
                super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            answered = self.cycle is not None and self.cycle.response_complete
            super().on_message_complete()
            if answered:  # the rest of an answered body is in: the connection is idle again
                self._cancel_rest()
                if (
                    self.timeout_keep_alive_task is None
                    and not self.pipeline
                    and not self.transport.is_closing()
                ):
                    self.timeout_keep_alive_task = self.loop.call_later(
                        self.timeout_keep_alive, self.timeout_keep_alive_handler
                    )

    return GuardedHttpToolsProtocol


def tls_extension(transport: asyncio.BaseTransport) -> dict[object, object] | None:
    """The ASGI TLS extension of a connection (None on plain HTTP): its client certificate as PEM in
    ``client_cert_chain`` (empty when the client sent none; verified against the client CA by then).
    Typed as the scope's extensions are (uvicorn's ASGI types)."""
    tls = transport.get_extra_info("ssl_object")
    if tls is None:
        return None
    der = tls.getpeercert(binary_form=True)
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": None,
        "client_cert_error": None,
        "tls_version": None,
        "cipher_suite": None,
    }


def tls_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's TLS options: HTTPS with the settings' certificate; with a client CA (mutual TLS) a
    client certificate is asked for and verified when sent. It is optional at the handshake (the
    operator's browser and curl need none); a client's token is bound to its certificate instead
    (api/tls.py), so a site without the certificate it enrolled with is refused."""
    if settings.tls_cert_file is None:
        return {}
    options: dict[str, Any] = {
        "ssl_certfile": str(settings.tls_cert_file),
        "ssl_keyfile": str(settings.tls_key_file),
    }
    if settings.tls_client_ca_file is not None:
        options |= {"ssl_ca_certs": str(settings.tls_client_ca_file), "ssl_cert_reqs": ssl.CERT_OPTIONAL}
    return options


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn.run options that enforce the settings' connection limits, proxy trust and TLS."""
    protocol = guarded_protocol(settings.header_timeout_s, settings.max_header_bytes, settings.body_timeout_s)
    trusted = settings.trusted_proxies
    return tls_options(settings) | {
        "http": protocol or "h11",
        "h11_max_incomplete_event_size": settings.max_header_bytes,  # the h11 fallback's head limit
        "timeout_keep_alive": settings.keep_alive_s,
        "limit_concurrency": settings.max_connections,
        # X-Forwarded-For / -Proto only from the proxies named (uvicorn's default trusts 127.0.0.1)
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted or None,
    }
