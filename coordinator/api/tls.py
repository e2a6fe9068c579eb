"""Mutual TLS at the API: a site's client certificate, bound to its client at enrolment.

With FEDPROMPT_TLS_CLIENT_CA_FILE set, the server asks every connection for a client certificate and
verifies one that is sent against that CA (server.py); which client a certificate belongs to is
decided here. A site enrols with its certificate, whose SHA-256 fingerprint is stored with the client;
from then on a request with that client's token is accepted only over a connection that presented
the same certificate. A stolen client token is useless without the site's private key, and an
enrolment token alone no longer enrols anyone.
"""

from __future__ import annotations

import hashlib
import ssl

from fastapi import Request
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.errors import Forbidden
from fedprompt.coordinator.persistence.db import Client


def client_certificate_sha256(request: Request) -> str | None:
    """The hex SHA-256 of the DER client certificate of the request's connection, or None."""
    chain = request.scope.get("extensions", {}).get("tls", {}).get("client_cert_chain") or []
    if not chain:
        return None
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(chain[0])).hexdigest()


def enrolment_certificate(request: Request, settings: Settings) -> str | None:
    """The fingerprint to bind at enrolment: required under mutual TLS (403 without a certificate)."""
    fingerprint = client_certificate_sha256(request)
    if settings.tls_client_ca_file is not None and fingerprint is None:
        raise Forbidden(
            "this coordinator uses mutual TLS: enrol over a connection with your site's client certificate "
            "(the worker's FEDPROMPT_CLIENT_CERT_FILE and FEDPROMPT_CLIENT_KEY_FILE)"
        )
    return fingerprint


def check_client_certificate(request: Request, client: Client, settings: Settings) -> None:
    """Refuse (403) a client's request that does not come with the certificate it enrolled with."""
    if settings.tls_client_ca_file is None and client.tls_fingerprint is None:
        return
    presented = client_certificate_sha256(request)
    if client.tls_fingerprint is None:
        raise Forbidden(
            f"client {client.id} enrolled without a client certificate and this coordinator uses mutual "
            "TLS; enrol again with the site's certificate"
        )
    if presented != client.tls_fingerprint:
        raise Forbidden(
            f"client {client.id}'s token came without the client certificate it enrolled with"
            + ("" if presented is None else " (another certificate was presented)")
        )
