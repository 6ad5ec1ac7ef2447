"""Every setting of the project, read from environment variables and validated once.

A bad value fails at start-up with a :class:`SettingsError` that names the variable and says what
is wrong, never echoing the value (URLs carry passwords). Numbers must be finite, and durations
end at :data:`MAX_DURATION_MS`: a value a client cannot hold would otherwise fail later, in a
worker thread, at shutdown or on the first job.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from jobsystem.limits import Limit, parse_limits
from jobsystem.mail_address import is_address
from jobsystem.urls import (
    SOCKS_REFUSED,
    check_amqp_url,
    check_redis_url,
    check_smtp_url,
    check_sqlite_url,
    check_url,
    socks_proxy_variable,
    split_credentials,
)

#: ``RATE_LIMITS`` when unset: the reference email actor spends from ``smtp``. 100 mails a minute
#: with bursts of 20 stays within what ordinary SMTP relays accept; raise it for a transactional
#: email provider (they allow tens per second).
DEFAULT_RATE_LIMITS: dict[str, object] = {"smtp": {"rate": "100/minute", "burst": 20}}


#: The SMTP round trips of one mail, each allowed ``SMTP_TIMEOUT``: connect, greeting, EHLO,
#: STARTTLS, the TLS handshake (2), EHLO, AUTH (up to 3), MAIL, RCPT, DATA, the mail's end, QUIT.
SMTP_ROUND_TRIPS = 15
#: The shortest time limit a mail's job may get: 10 s beyond the round trips (the connection's
#: set-up and the mail's build), and a timeout of at least 1 s for each round trip.
SMTP_LEAST_TIME_LIMIT_MS = 10_000 + SMTP_ROUND_TRIPS * 1_000


#: The longest duration a setting may hold: ten years, RabbitMQ's own limit for a message TTL.
#: Past it Redis refuses expiry times and thread joins overflow; nothing sensible waits longer.
MAX_DURATION_MS = 315_360_000_000


class SettingsError(ImportError):
    """The environment holds invalid settings; ``problems`` says ``VARIABLE: what is wrong``, one each.

    An ``ImportError`` because ``import actors`` is where it surfaces. The entry points turn it
    into one line per problem and exit code 2 (see :mod:`jobsystem.startup`).
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid settings: " + "; ".join(problems))
        self.problems = problems

    def report(self, program: str) -> str:
        """What ``program`` prints: one line per problem, ``program: invalid setting NAME: ...``."""
        return "".join(f"{program}: invalid setting {problem}\n" for problem in self.problems)


_KEY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


class Settings(BaseModel):
    """The project's configuration; each field is the environment variable of the same name, upper-cased."""

    # nan and inf pass every bound (nan compares false, inf is above any minimum): refuse them.
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    # RabbitMQ
    rabbitmq_url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    rabbitmq_management_url: str = "http://127.0.0.1:15672"
    rabbitmq_heartbeat: int = Field(default=60, ge=0, le=3600)
    rabbitmq_blocked_connection_timeout: int = Field(default=300, ge=1, le=86_400)
    rabbitmq_max_priority: int = Field(default=10, ge=0, le=255)
    rabbitmq_consumer_timeout_ms: int = Field(default=1_800_000, ge=60_000, le=MAX_DURATION_MS)
    # Delays up to this long are held by a worker; longer ones wait in RabbitMQ's delay cascade.
    delay_horizon_ms: int = Field(default=30_000, ge=2_000, le=MAX_DURATION_MS)
    queue_prefix: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$", max_length=100)

    # Shared state (idempotency, rate limits, job status, scheduler lease)
    state_url: str = "sqlite:///var/state.db"
    state_timeout: float = Field(default=2.0, gt=0, le=60)

    # Dead letters (kept until replayed or purged unless capped)
    dead_letter_ttl_ms: int | None = Field(default=None, ge=1_000, le=MAX_DURATION_MS)
    dead_letter_max_length: int | None = Field(default=None, ge=1, le=2**63 - 1)

    # Idempotency keys
    idempotency_ttl_ms: int = Field(default=86_400_000, ge=1_000, le=MAX_DURATION_MS)
    idempotency_lease_ms: int = Field(default=30_000, ge=1_000, le=MAX_DURATION_MS)
    idempotency_drop_duplicates: bool = True

    # Results, workflows and cancellation
    result_ttl_ms: int = Field(default=86_400_000, ge=1_000, le=MAX_DURATION_MS)
    cancel_ttl_ms: int = Field(default=604_800_000, ge=1_000, le=MAX_DURATION_MS)

    # Scheduler (python -m scheduler)
    schedules_file: Path | None = None
    scheduler_lease_ms: int = Field(default=15_000, ge=1_000, le=600_000)
    # Job status, queue health, metrics
    job_status: bool = True
    job_status_ttl_ms: int = Field(default=86_400_000, ge=1_000, le=MAX_DURATION_MS)
    health_max_waiting: int = Field(default=10_000, ge=0)
    health_max_dead_letters: int = Field(default=100, ge=0)
    health_max_age_ms: int = Field(default=600_000, ge=1_000, le=MAX_DURATION_MS)
    prometheus_port: int = Field(default=9191, ge=0, le=65_535)
    prometheus_host: str = "127.0.0.1"
    prometheus_dir: Path = Path(tempfile.gettempdir()) / "jobs-prometheus"
    # Rate limits (JSON object: service -> {"rate": 25 | "N/second|minute|hour", "burst": N})
    rate_limits: dict[str, Limit] = Field(default_factory=lambda: parse_limits(DEFAULT_RATE_LIMITS))
    rate_limit_wait_ms: int = Field(default=1_000, ge=0, le=60_000)
    rate_limit_max_delay_ms: int = Field(default=86_400_000, ge=1_000, le=MAX_DURATION_MS)
    rate_limit_lease_jobs: int = Field(default=32, ge=0, le=1_000)

    # Logging and errors
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["json", "console"] = "console"
    sentry_dsn: str | None = None
    sentry_environment: str = "production"
    sentry_release: str | None = None
    sentry_server_name: str | None = None
    # Personal data in logs and Sentry: a hash key turns removed values into stable keyed hashes.
    pii_hash_key: SecretStr | None = None
    pii_extra_keys: tuple[str, ...] = ()
    # Store keys built from job data (idempotency keys, rate-limit bucket keys) are keyed hashes.
    state_key_secret: SecretStr | None = None
    sentry_crons: bool = True

    # Reference actors
    smtp_url: str = "smtp://127.0.0.1:1025"
    smtp_timeout: float = Field(default=30.0, gt=0, le=3600)
    mail_from: str = "jobs@example.com"
    reports_dir: Path = Path("var/reports")
    media_dir: Path = Path("var/media")

    # The operators' dashboard (jobctl dashboard)
    dashboard_host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    dashboard_port: int = Field(default=8181, ge=1, le=65_535)
    dashboard_admin_password: SecretStr | None = None
    dashboard_viewer_password: SecretStr | None = None

    # Worker tuning
    worker_processes: int = Field(default=2, ge=1, le=256)
    worker_threads: int = Field(default=8, ge=1, le=1024)
    worker_prefetch: int = Field(default=0, ge=0, le=65_535)
    worker_shutdown_timeout_ms: int = Field(default=600_000, ge=1_000, le=MAX_DURATION_MS)
    job_time_limit_ms: int = Field(default=600_000, ge=1_000, le=MAX_DURATION_MS)
    job_max_age_ms: int | None = Field(default=None, ge=1_000, le=MAX_DURATION_MS)
    job_max_retries: int = Field(default=5, ge=0, le=100)
    job_min_backoff_ms: int = Field(default=15_000, ge=100, le=MAX_DURATION_MS)
    job_max_backoff_ms: int = Field(default=600_000, ge=100, le=MAX_DURATION_MS)

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _normalise_case(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        return value.lower() if value.lower() in ("json", "console") else value.upper()

    @field_validator("rabbitmq_url")
    @classmethod
    def _check_amqp_url(cls, value: str) -> str:
        # Several nodes of a cluster are separated by ";"; clients fail over in order.
        for node in value.split(";"):
            check_amqp_url(node)
        return value

    @field_validator("rabbitmq_management_url")
    @classmethod
    def _check_http_url(cls, value: str) -> str:
        check_url(value, ("http", "https"))
        # The API's paths go after the URL's own (a reverse proxy's prefix): a query string or a
        # fragment would swallow them. No raw '?' or '#' is in credentials (check_url: no '@' after).
        if "?" in value or "#" in value:
            raise ValueError(
                "takes no query string or fragment, only scheme, credentials, host, port and path"
            )
        return value

    @field_validator("smtp_url")
    @classmethod
    def _check_smtp_url(cls, value: str) -> str:
        check_smtp_url(value)
        return value

    @field_validator("mail_from")
    @classmethod
    def _check_mail_from(cls, value: str) -> str:
        if not is_address(value):
            raise ValueError("must be one bare email address, local@domain (no name, space or line break)")
        return value

    @field_validator("state_url")
    @classmethod
    def _check_state_url(cls, value: str) -> str:
        if urlsplit(value).scheme in ("redis", "rediss"):
            check_redis_url(value)
        else:
            check_sqlite_url(value)
        return value

    @field_validator("rate_limits", mode="before")
    @classmethod
    def _parse_rate_limits(cls, value: object) -> dict[str, Limit]:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("is not valid JSON") from None
        if not isinstance(value, Mapping):
            raise ValueError("must be a JSON object mapping service names to {rate, burst}")
        return parse_limits(value)

    @field_validator("sentry_dsn")
    @classmethod
    def _check_sentry_dsn(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.username:
            raise ValueError("must be a Sentry DSN such as https://key@o0.ingest.sentry.io/0")
        from sentry_sdk.utils import Dsn  # here: only a process given a DSN pays for the import

        try:
            Dsn(value)  # sentry_sdk's own parse (a project id, a port in range), as init would
        except Exception:
            raise ValueError("must be a Sentry DSN such as https://key@o0.ingest.sentry.io/0") from None
        return value

    @field_validator("pii_hash_key", "state_key_secret")
    @classmethod
    def _check_hash_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be a random secret of at least 16 characters")
        return value

    @field_validator("dashboard_admin_password", "dashboard_viewer_password")
    @classmethod
    def _check_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 12:
            raise ValueError("must be at least 12 characters (a random one: it guards actions on the jobs)")
        return value

    @field_validator("pii_extra_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        keys = tuple(key.strip() for key in value.split(",") if key.strip())
        if not all(_KEY_NAME.fullmatch(key) for key in keys):
            raise ValueError("must be key names separated by commas (letters, digits, _ and -)")
        return keys

    @model_validator(mode="after")
    def _check_against_consumer_timeout(self) -> Settings:
        """Settings that must agree with each other; every disagreement, one line each."""
        problems = []
        if self.job_min_backoff_ms > self.job_max_backoff_ms:
            problems.append("JOB_MIN_BACKOFF_MS: must not exceed JOB_MAX_BACKOFF_MS")
        # A job running past consumer_timeout has its channel closed under it and is redelivered
        # while it still runs: the time limit must stop it first. It starts once the job's token
        # came, which the worker may have waited RATE_LIMIT_WAIT_MS for.
        if self.job_time_limit_ms + self.rate_limit_wait_ms >= self.rabbitmq_consumer_timeout_ms:
            problems.append(
                "JOB_TIME_LIMIT_MS: plus RATE_LIMIT_WAIT_MS, must be below RABBITMQ_CONSUMER_TIMEOUT_MS "
                "(RabbitMQ redelivers a job still running past it)"
            )
        # A worker holds a delay up to the horizon unacked (longer ones wait in RabbitMQ): keep
        # well clear of the consumer timeout, since a busy worker releases them late.
        if self.delay_horizon_ms * 2 > self.rabbitmq_consumer_timeout_ms:
            problems.append(
                "DELAY_HORIZON_MS: must be at most half of RABBITMQ_CONSUMER_TIMEOUT_MS "
                "(a worker holds delays up to the horizon unacked until they are due)"
            )
        # The mail actor's time limit (90 % of what the wait leaves) must hold every SMTP round trip.
        if self.longest_time_limit_ms < SMTP_LEAST_TIME_LIMIT_MS:
            problems.append(
                f"RABBITMQ_CONSUMER_TIMEOUT_MS: minus RATE_LIMIT_WAIT_MS, must be at least "
                f"{-(-SMTP_LEAST_TIME_LIMIT_MS * 10 // 9)} ms (the send_email time limit, 90 % of "
                f"it, must hold 10 s and {SMTP_ROUND_TRIPS} SMTP round trips of at least 1 s)"
            )
        if self.rate_limit_wait_ms >= self.rate_limit_max_delay_ms:
            problems.append("RATE_LIMIT_WAIT_MS: must be below RATE_LIMIT_MAX_DELAY_MS")
        admin, viewer = self.dashboard_admin_password, self.dashboard_viewer_password
        if admin is not None and viewer is not None and admin.get_secret_value() == viewer.get_secret_value():
            problems.append(
                "DASHBOARD_VIEWER_PASSWORD: must differ from DASHBOARD_ADMIN_PASSWORD "
                "(the read-only viewer could log in as admin)"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def management_url(self) -> str:
        """The management API's base URL, without credentials (:attr:`management_auth`): HTTP
        clients quote a request's URL in their errors (``404 Client Error: ... for url: ...``),
        which end up in logs, CLI output and JSON summaries."""
        return split_credentials(self.rabbitmq_management_url)[0].rstrip("/")

    @property
    def management_auth(self) -> tuple[str, str]:
        """The management API's user and password (decoded): the URL's own, else ``RABBITMQ_URL``'s."""
        own = split_credentials(self.rabbitmq_management_url)[1]
        if own is not None:
            return own
        amqp = urlsplit(self.rabbitmq_url.split(";")[0])
        return unquote(amqp.username or "guest"), unquote(amqp.password or "guest")

    def management_api(self, *segments: str) -> str:
        """The management API's URL of ``segments`` (``"overview"``), each percent-encoded (a
        ``/`` in a vhost or queue name too) and put after the base URL's own path: the one place
        these URLs are built, so none is spelt differently."""
        return "/".join([self.management_url, "api", *(quote(segment, safe="") for segment in segments)])

    def queues_api(self, *segments: str) -> str:
        """:meth:`management_api` of this vhost's queues, or of one (``name``, ``name, "get"``)."""
        return self.management_api("queues", self.rabbitmq_vhost, *segments)

    @property
    def longest_time_limit_ms(self) -> int:
        """The longest time limit an actor may have: 90% of what ``RABBITMQ_CONSUMER_TIMEOUT_MS``
        leaves once the job waited ``RATE_LIMIT_WAIT_MS`` for its token (the limit starts after)."""
        return (self.rabbitmq_consumer_timeout_ms - self.rate_limit_wait_ms) * 9 // 10

    @property
    def smtp_time_limit_ms(self) -> int:
        """The time limit of a mail's job: room for every SMTP round trip to take ``SMTP_TIMEOUT``
        (and 10 s more), at most :attr:`longest_time_limit_ms`."""
        wanted = int(SMTP_ROUND_TRIPS * self.smtp_timeout * 1000) + 10_000
        return min(wanted, self.longest_time_limit_ms)

    @property
    def smtp_operation_timeout(self) -> float:
        """Seconds each SMTP operation may take: ``SMTP_TIMEOUT``, lowered when all the round trips
        would not fit in :attr:`smtp_time_limit_ms`. A slow relay then fails with a timeout
        (retried), never interrupted by the time limit half-way through a send."""
        fits = (self.smtp_time_limit_ms - 10_000) / 1000 / SMTP_ROUND_TRIPS
        return min(self.smtp_timeout, fits)

    @property
    def state_namespace(self) -> str:
        """The prefix of every key in the state store (environments sharing a Redis stay apart)."""
        return f"jobs:{self.queue_prefix}"

    def queue(self, name: str) -> str:
        """The RabbitMQ queue for ``name``: ``QUEUE_PREFIX`` lets environments share one vhost."""
        return self.queue_prefix + name

    @property
    def rabbitmq_vhost(self) -> str:
        """The virtual host named by ``RABBITMQ_URL`` (``/`` when it names none)."""
        path = urlsplit(self.rabbitmq_url.split(";")[0]).path
        return unquote(path[1:]) if len(path) > 1 else "/"


def _describe(error: dict[str, object]) -> list[str]:
    """``VARIABLE: what is wrong`` for one pydantic error (a cross-field one may hold several)."""
    loc = error.get("loc") or ()
    message = str(error.get("msg", "is invalid")).removeprefix("Value error, ")
    if isinstance(loc, tuple) and loc:
        return [f"{str(loc[0]).upper()}: {message}"]
    return message.splitlines()  # from _check_against_consumer_timeout, each naming its variable


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings; raise :class:`SettingsError` naming every bad variable."""
    env = os.environ if environ is None else environ
    # An empty variable counts as unset, as compose files and shells often pass them.
    values = {name: env[name.upper()] for name in Settings.model_fields if env.get(name.upper())}
    try:
        settings = Settings.model_validate(values)
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False, include_context=False)
        raise SettingsError([line for e in errors for line in _describe(dict(e))]) from None
    # requests reads the proxy variables from the process's environment at each call, as here.
    socks = socks_proxy_variable(settings.management_url)
    if socks:
        raise SettingsError([f"{socks}: {SOCKS_REFUSED}"])
    return settings
