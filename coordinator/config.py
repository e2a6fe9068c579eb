"""Coordinator settings, read from the environment (prefix FEDPROMPT_)."""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

from fedprompt.coordinator.hosting.ratelimit import parse_limits
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

# A folder of secret files, one per setting, named like the variable (fedprompt_admin_token,
# fedprompt_database_url): Docker / Kubernetes secrets mounted as files. Variables win over files.
SECRETS_DIR_ENV = "FEDPROMPT_SECRETS_DIR"


class ConfigError(RuntimeError):
    """The coordinator cannot start with this configuration."""


class Settings(BaseSettings):
    """Every knob of the coordinator; FEDPROMPT_DATABASE_URL, FEDPROMPT_ADMIN_TOKEN, ..."""

    model_config = SettingsConfigDict(env_prefix="FEDPROMPT_", env_file=None, extra="ignore")

    data_dir: Path = Field(Path("data"), description="Where the default SQLite file and dev token live.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/fedprompt.db"
    )
    admin_token: SecretStr | None = Field(None, description="Bearer token for operator calls (required).")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_upload_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Uploads larger are refused (413).")
    max_request_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Any other request body larger is refused (413) before it is read.",
    )
    rate_limits: bool = Field(
        True, description="Per-IP limits on enrolment and failed authentications; false turns both off."
    )
    enrolment_rate_limit: str = Field(
        "120/minute",
        description="Enrolment attempts per client IP ('N/second|minute|hour', ';' for several).",
    )
    failed_auth_rate_limit: str = Field(
        "60/minute", description="Failed authentications per client IP before it is answered 429."
    )
    default_round_deadline_s: float = Field(600.0, gt=0)
    sweep_interval_s: float = Field(
        1.0, gt=0, description="How often deadlines and round starts are checked."
    )
    long_poll_max_s: float = Field(30.0, ge=0)
    keep_alive_s: float = Field(
        30.0,
        gt=0,
        description="How long an idle HTTP connection is kept open; longer than clients keep theirs "
        "(httpx: 5 s), so a client never reuses a connection the server is closing.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's line and headers must arrive within this many seconds of its first "
        "byte (of the connection's opening, for its first request); else the connection is closed.",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A request's body must arrive whole within this many seconds of the route's first "
        "read of it; else 408 and the connection is closed (a 30 KiB prompt takes milliseconds).",
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Request line and headers larger are answered 431 and the connection closed.",
    )
    max_connections: int | None = Field(
        4096,
        ge=1,
        description="Open connections (and requests in progress) past which uvicorn answers 503 "
        "(its limit_concurrency); none: no limit. Keep it under the process's file descriptor limit.",
    )
    max_request_bytes_in_flight_per_address: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Bytes of JSON and form bodies one address has in flight at once (they are read "
        "before any token is checked); a body that would pass it is answered 429.",
    )
    max_uploads_per_client: int = Field(
        2,
        ge=1,
        le=1000,
        description="Uploads of one client (or of the admin's initial prompt) in progress at once; "
        "one more is answered 429 before its body is read.",
    )
    max_upload_bytes_in_flight_per_client: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="Bytes of one client's uploads held by the coordinator at once (received and not "
        "yet stored); an upload that would pass it is answered 429.",
    )
    max_upload_bytes_in_flight: int = Field(
        128 * 1024 * 1024,
        ge=1024,
        description="Bytes of all clients' uploads held by this process at once (received and not yet "
        "stored), so that memory does not grow with the number of clients; an upload that would pass it "
        "is answered 429 with Retry-After.",
    )
    trusted_proxies: str = Field(
        "",
        description="Addresses or networks (comma-separated; '*' for any) of reverse proxies whose "
        "X-Forwarded-For and X-Forwarded-Proto are believed; empty (the default): none, not even "
        "loopback, so rate limits key on the connection's own address.",
    )
    tls_cert_file: Path | None = Field(
        None,
        description="PEM certificate (chain) to serve HTTPS with; needs FEDPROMPT_TLS_KEY_FILE. None: plain "
        "HTTP (behind a TLS-terminating proxy, or on loopback).",
    )
    tls_key_file: Path | None = Field(None, description="PEM private key of FEDPROMPT_TLS_CERT_FILE.")
    tls_client_ca_file: Path | None = Field(
        None,
        description="Mutual TLS: PEM CA certificate(s) that sign the sites' client certificates. A client "
        "then enrols with a certificate from this CA, its fingerprint is bound to it, and every request "
        "with its token must come with that certificate (403 otherwise). Needs FEDPROMPT_TLS_CERT_FILE.",
    )
    long_poll_interval_s: float = Field(0.25, gt=0)
    threads: int = Field(
        8, ge=1, le=1000, description="Threads that serve requests' database work (uploads excepted)."
    )
    upload_threads: int = Field(
        32,
        ge=1,
        le=1000,
        description="Threads of their own for uploads, so an upload never queues behind polls, "
        "downloads and evaluation reports; the uploads waiting together are committed in one "
        "transaction by one of them, so more threads make larger batches, not more connections.",
    )
    auth_cache_s: float = Field(
        300.0,
        ge=0,
        description="How long a checked client token is trusted without a database lookup (0: never). "
        "A revocation is announced to every coordinator process (Postgres NOTIFY), which drops the token "
        "at once; this bounds how long a missed announcement could let a revoked client read (its writes "
        "re-check it in their own transaction).",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Read secret files from $FEDPROMPT_SECRETS_DIR (pydantic-settings' secrets_dir) when it is set."""
        secrets_dir = os.environ.get(SECRETS_DIR_ENV)
        if secrets_dir:
            if not Path(secrets_dir).is_dir():
                raise ConfigError(f"{SECRETS_DIR_ENV}={secrets_dir} is not a folder; mount the secrets there")
            file_secret_settings = SecretsSettingsSource(settings_cls, secrets_dir=secrets_dir)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("admin_token")
    @classmethod
    def _non_trivial(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError(
                "FEDPROMPT_ADMIN_TOKEN must be at least 16 characters (e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: str) -> str:
        for item in (x.strip() for x in v.split(",") if x.strip()):
            if item != "*":
                try:
                    ipaddress.ip_network(item, strict=False)
                except ValueError:
                    raise ValueError(
                        f"FEDPROMPT_TRUSTED_PROXIES: {item!r} is not an address, a network (10.0.0.0/8) or '*'"
                    ) from None
        return ",".join(x.strip() for x in v.split(",") if x.strip())

    @field_validator("enrolment_rate_limit", "failed_auth_rate_limit")
    @classmethod
    def _rate_limit(cls, v: str) -> str:
        parse_limits(v)
        return v

    @model_validator(mode="after")
    def _tls(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                "FEDPROMPT_TLS_CERT_FILE and FEDPROMPT_TLS_KEY_FILE go together: set both or neither"
            )
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError(
                "FEDPROMPT_TLS_CLIENT_CA_FILE (mutual TLS) needs FEDPROMPT_TLS_CERT_FILE and _KEY_FILE"
            )
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"FEDPROMPT_{name.upper()}={path}: no such file")
        return self

    @property
    def url(self) -> str:
        """The database URL in effect."""
        return self.database_url or f"sqlite:///{(self.data_dir / 'fedprompt.db').resolve()}"

    def admin_secret(self) -> str:
        """The admin token; only valid after ``require_admin_token``."""
        assert self.admin_token is not None
        return self.admin_token.get_secret_value()


SECRET_SETTINGS = frozenset({"admin_token", "database_url"})  # their values are never echoed


def config_error_line(exc: ValidationError, prefix: str = "FEDPROMPT_") -> str:
    """A ValidationError of settings as one line: each wrong setting by its variable, and its rule
    (no pydantic dump, no documentation link; a secret's value is never repeated)."""
    parts = []
    for error in exc.errors(include_url=False):
        name = ".".join(str(p) for p in error["loc"]) or "settings"
        message = error["msg"].removeprefix("Value error, ")
        variable = f"{prefix}{name.upper()}"
        if message.startswith(variable) or (not error["loc"] and message.startswith(prefix)):
            # the validator's message names the setting(s) already
            parts.append(message)
            continue
        given = error.get("input")
        shown = "" if name in SECRET_SETTINGS or isinstance(given, dict) else f" (got {given!r})"
        parts.append(f"{variable}: {message}{shown}")
    return "; ".join(parts)


def load_settings() -> Settings:
    """Settings from the environment (and $FEDPROMPT_SECRETS_DIR), or a ConfigError of one line."""
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {config_error_line(exc)}") from None


def admin_token_origin(settings: Settings) -> str:
    """Where the admin token of `settings` (read before --dev's file) comes from, for the start-up line."""
    if settings.admin_token is None:
        return "none"
    if os.environ.get("FEDPROMPT_ADMIN_TOKEN"):
        return "the environment (FEDPROMPT_ADMIN_TOKEN)"
    if os.environ.get(SECRETS_DIR_ENV):
        return f"the secret file {Path(os.environ[SECRETS_DIR_ENV]) / 'fedprompt_admin_token'}"
    return "the settings"


def dev_token_line(before: Settings, token_file_existed: bool) -> str:
    """What `serve --dev` says about the admin token: where it comes from, and how to use the file."""
    path = before.data_dir / "admin-token"
    if before.admin_token is not None:
        return f"dev mode: admin token from {admin_token_origin(before)} (no file written)"
    how = f"export FEDPROMPT_ADMIN_TOKEN=$(cat {path})"
    if token_file_existed:
        return f"dev mode: admin token read from {path}; for the fedprompt CLI: {how}"
    return f"dev mode: admin token written to {path} (mode 0600); for the fedprompt CLI: {how}"


def require_admin_token(settings: Settings, *, dev: bool) -> Settings:
    """Refuse to start without an admin token, unless --dev: then generate one into a 0600 file."""
    if settings.admin_token is not None:
        return settings
    if not dev:
        raise ConfigError(
            "FEDPROMPT_ADMIN_TOKEN is not set. Set it to a long random secret "
            "(e.g. `export FEDPROMPT_ADMIN_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')`), "
            "or start with --dev to generate one for local use."
        )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path = settings.data_dir / "admin-token"
    if path.exists():
        token = path.read_text().strip()
    else:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
    os.chmod(path, 0o600)
    return settings.model_copy(update={"admin_token": SecretStr(token)})
