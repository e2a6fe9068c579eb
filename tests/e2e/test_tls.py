"""A federation over TLS and one over mutual TLS: a real `fedprompt-coordinator serve` process with
certificates made here (a private CA, a server certificate for 127.0.0.1, site certificates), and
the client library every worker and the CLI use (shared/client.py, shared/tls.py).

Over TLS the coordinator is reached only by a client that trusts the federation's CA. Under mutual
TLS a site enrols with its certificate and its token then works only with that certificate: the same
token from another site's certificate, or with none, is refused (403); a certificate from another CA
is refused at the handshake; an enrolment token alone enrols nobody.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fedprompt.shared.client import ApiError, CoordinatorClient
from fedprompt.shared.contract import Enrolled, EvaluateTask, TrainTask
from fedprompt.shared.tls import ClientTLS, TLSConfigError, default_context

from tests.helpers import ADMIN, SMALL_SPEC, coordinator_process, update_blob

pytestmark = pytest.mark.slow


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(
    folder: Path,
    stem: str,
    common: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    *,
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate and key in folder/stem.pem and folder/stem.key; self-signed CA when no issuer."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(issuer[0].subject if issuer else _name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{stem}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca (the federation's), server (127.0.0.1), site-a and site-b (from ca), rogue (from another CA)."""
    folder = tmp_path_factory.mktemp("pki")
    ca = _issue(folder, "ca", "fedprompt test CA")
    _issue(folder, "server", "coordinator", ca, server=True)
    _issue(folder, "site-a", "site a", ca)
    _issue(folder, "site-b", "site b", ca)
    _issue(folder, "rogue", "rogue", _issue(folder, "other-ca", "another CA"))
    return folder


def _site(pki: Path, stem: str | None) -> ClientTLS:
    if stem is None:
        return ClientTLS(ca_file=pki / "ca.pem")
    return ClientTLS(ca_file=pki / "ca.pem", cert_file=pki / f"{stem}.pem", key_file=pki / f"{stem}.key")


@contextmanager
def tls_coordinator(pki: Path, workdir: Path, *, mutual: bool) -> Iterator[str]:
    env = {
        "FEDPROMPT_TLS_CERT_FILE": str(pki / "server.pem"),
        "FEDPROMPT_TLS_KEY_FILE": str(pki / "server.key"),
        **({"FEDPROMPT_TLS_CLIENT_CA_FILE": str(pki / "ca.pem")} if mutual else {}),
    }
    trust = _site(pki, None).verify()
    assert isinstance(trust, ssl.SSLContext)
    with coordinator_process(f"sqlite:///{workdir / 'tls.db'}", workdir, extra_env=env, verify=trust) as (
        url,
        _,
    ):
        yield url


def _one_round(
    url: str, admin: CoordinatorClient, sites: list[CoordinatorClient]
) -> tuple[int, list[Enrolled]]:
    """Create a federation, enrol each site with its own connection, upload round 1: (fid, enrolled)."""
    fid = admin.create_federation(SMALL_SPEC).id
    enrolment = admin.create_enrollment_token(fid)
    enrolled = [
        site.enroll(fid, enrolment, name=f"site-{i}", num_samples=10, info={}) for i, site in enumerate(sites)
    ]
    for i, (site, who) in enumerate(zip(sites, enrolled, strict=True)):
        as_site = site.with_token(who.token)
        task = as_site.task(fid, wait=5)
        while isinstance(task, EvaluateTask):  # the starting prompt's evaluation first
            as_site.report_evaluation(fid, task.round, {"num_samples": 10, "accuracy": 0.5})
            task = as_site.task(fid, wait=5)
        assert isinstance(task, TrainTask) and task.round == 1, task
        status, _ = as_site.upload(fid, 1, update_blob(SMALL_SPEC, i, base_version=0))
        assert status == 201
    deadline = time.monotonic() + 30
    while admin.federation(fid).latest_version < 1:
        assert time.monotonic() < deadline, admin.federation(fid)
        time.sleep(0.2)
    return fid, enrolled


def test_a_federation_over_tls(pki: Path, tmp_path: Path) -> None:
    with tls_coordinator(pki, tmp_path, mutual=False) as url:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{url}/healthz")  # the system's trust store does not know the federation's CA
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https:", "http:") + "/healthz")  # no plain HTTP on a TLS port
        tls = _site(pki, None)
        with CoordinatorClient(url, ADMIN, tls=tls) as admin:
            sites = [CoordinatorClient(url, tls=tls) for _ in range(2)]
            fid, _ = _one_round(url, admin, sites)
            assert admin.federation(fid).latest_version == 1
            for site in sites:
                site.close()


def test_a_federation_over_mutual_tls_binds_each_site_to_its_certificate(pki: Path, tmp_path: Path) -> None:
    with (
        tls_coordinator(pki, tmp_path, mutual=True) as url,
        CoordinatorClient(url, ADMIN, tls=_site(pki, None)) as admin,
    ):  # the operator needs no certificate
        site_a, site_b = (
            CoordinatorClient(url, tls=_site(pki, "site-a")),
            CoordinatorClient(url, tls=_site(pki, "site-b")),
        )
        fid, (a, _) = _one_round(url, admin, [site_a, site_b])
        assert admin.federation(fid).latest_version == 1

        # site a's token, from site b's connection or from one without a certificate: refused
        for other in (_site(pki, "site-b"), _site(pki, None)):
            with (
                CoordinatorClient(url, a.token, tls=other) as thief,
                pytest.raises(ApiError) as refused,
            ):
                thief.spec(fid)
            assert refused.value.status == 403 and "certificate it enrolled with" in str(refused.value)
        assert site_a.with_token(a.token).spec(fid)["name"] == SMALL_SPEC["name"]

        # an enrolment token alone enrols nobody
        enrolment = admin.create_enrollment_token(fid)
        with CoordinatorClient(url, tls=_site(pki, None)) as bare, pytest.raises(ApiError) as refused:
            bare.enroll(fid, enrolment, name="no-certificate", num_samples=1, info={})
        assert refused.value.status == 403 and "mutual TLS" in str(refused.value)
        assert len(admin.clients(fid)) == 2

        # a certificate from another CA does not get past the handshake
        rogue = ClientTLS(ca_file=pki / "ca.pem", cert_file=pki / "rogue.pem", key_file=pki / "rogue.key")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/healthz", verify=rogue.verify())
        site_a.close()
        site_b.close()


def test_client_tls_settings_are_checked_in_one_line(pki: Path, tmp_path: Path) -> None:
    with pytest.raises(
        TLSConfigError, match="FEDPROMPT_CLIENT_CERT_FILE and FEDPROMPT_CLIENT_KEY_FILE go together"
    ):
        ClientTLS.from_env({"FEDPROMPT_CLIENT_CERT_FILE": str(pki / "site-a.pem")})
    with pytest.raises(TLSConfigError, match="FEDPROMPT_CA_FILE=.*: no such file"):
        ClientTLS.from_env({"FEDPROMPT_CA_FILE": str(tmp_path / "missing.pem")})
    env = {
        "FEDPROMPT_CA_FILE": str(pki / "ca.pem"),
        "FEDPROMPT_CLIENT_CERT_FILE": str(pki / "site-a.pem"),
        "FEDPROMPT_CLIENT_KEY_FILE": str(pki / "site-a.key"),
    }
    assert isinstance(ClientTLS.from_env(env).verify(), ssl.SSLContext)
    # without TLS files: httpx's default trust store, one context per process for every client
    assert ClientTLS.from_env({}).verify() is ClientTLS.from_env({}).verify() is default_context()
    assert default_context().verify_mode == ssl.CERT_REQUIRED and default_context().check_hostname


def test_server_tls_settings_are_checked_in_one_line(pki: Path, tmp_path: Path) -> None:
    from fedprompt.coordinator.config import Settings, config_error_line
    from pydantic import ValidationError

    base = {"admin_token": ADMIN, "data_dir": tmp_path}
    for given, says in (
        (
            {"tls_cert_file": pki / "server.pem"},
            "FEDPROMPT_TLS_CERT_FILE and FEDPROMPT_TLS_KEY_FILE go together",
        ),
        ({"tls_client_ca_file": pki / "ca.pem"}, r"FEDPROMPT_TLS_CLIENT_CA_FILE \(mutual TLS\) needs"),
        (
            {"tls_cert_file": tmp_path / "no.pem", "tls_key_file": pki / "server.key"},
            "FEDPROMPT_TLS_CERT_FILE=.*no.pem: no such file",
        ),
    ):
        with pytest.raises(ValidationError) as refused:
            Settings(**base, **given)
        line = config_error_line(refused.value)
        assert "\n" not in line and line.startswith("FEDPROMPT_TLS_"), line
        assert re.search(says, line), line
