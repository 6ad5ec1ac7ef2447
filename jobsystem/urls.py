"""What the URLs in settings may hold: scheme, host, port, path, and every query parameter.

The clients accept too much, or fail late: redis-py reads ``redis://host/abc`` as database 0,
pika takes ``?retry_delay=nan`` and only rejects ``?heartbeat=abc`` when the broker is built (a
traceback in every worker), and ``?starttls=ture`` would send mail in the clear. Each check
raises ValueError saying which part is wrong, never its value: URLs carry passwords.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import pika
import redis

__all__ = [
    "SOCKS_REFUSED",
    "check_amqp_url",
    "check_redis_url",
    "check_smtp_url",
    "check_sqlite_url",
    "check_url",
    "redact_url",
    "socks_proxy_variable",
    "split_credentials",
]


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its userinfo, and its user and password (decoded; None without a user):
    for clients that quote a request's URL in their errors, where a password must not be."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    if not parts.username:
        return bare, None
    return bare, (unquote(parts.username), unquote(parts.password or ""))


#: Why a SOCKS proxy for the management API is refused (at start-up, and at each call).
SOCKS_REFUSED = (
    "a SOCKS proxy for RABBITMQ_MANAGEMENT_URL is not supported (no deadline can end its "
    "connections): use an HTTP proxy, or name the host in NO_PROXY"
)


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***``, for logs and error messages."""
    if ";" in url:
        return ";".join(redact_url(node) for node in url.split(";"))
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def socks_proxy_variable(url: str) -> str | None:
    """The environment variable (``HTTPS_PROXY``, ``ALL_PROXY``, ...) by which ``requests`` would
    reach ``url`` through a SOCKS proxy (``NO_PROXY`` heeded, as requests reads them); None when
    it would not. Its name only: a proxy's URL may hold a password."""
    from requests.utils import get_environ_proxies  # here: only the callers pay for it

    proxies, parts = get_environ_proxies(url), urlsplit(url)
    # requests' own order (requests.utils.select_proxy): the scheme's proxy before ALL_PROXY.
    keys = (f"{parts.scheme}://{parts.hostname}", parts.scheme, f"all://{parts.hostname}", "all")
    key = next((key for key in keys if key in proxies), None)
    if key is None or not proxies[key].lower().startswith("socks"):
        return None
    named = [name for name in os.environ if name.lower() == f"{key}_proxy"]
    return min(named, key=str.isupper, default=f"{key.upper()}_PROXY")  # requests prefers lower case


@dataclass(frozen=True)
class _Range:
    """A numeric query parameter: whole or not, its bounds, and whether the low bound is excluded."""

    whole: bool
    low: float
    high: float
    above_low: bool = False

    def check(self, name: str, text: str) -> None:
        if self.whole:
            valid = re.fullmatch(r"\d{1,19}", text) is not None and self.low <= int(text) <= self.high
        else:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            valid = (
                math.isfinite(number)
                and self.high >= number
                and (number > self.low if self.above_low else number >= self.low)
            )
        if not valid:
            kind = "a whole number" if self.whole else "a finite number"
            low = f"above {self.low:.0f}" if self.above_low else f"at least {self.low:.0f}"
            raise ValueError(f"query parameter {name} must be {kind} {low} and at most {self.high:.0f}")


#: pika's numeric URL parameters (bounds as in the settings of the same name where there is one).
_AMQP_NUMBERS = {
    "heartbeat": _Range(whole=True, low=0, high=3600),
    "blocked_connection_timeout": _Range(whole=False, low=0, high=86_400, above_low=True),
    "connection_attempts": _Range(whole=True, low=1, high=100),
    "retry_delay": _Range(whole=False, low=0, high=3600),
    "socket_timeout": _Range(whole=False, low=0, high=3600, above_low=True),
    "stack_timeout": _Range(whole=False, low=0, high=3600, above_low=True),
    "channel_max": _Range(whole=True, low=1, high=65_535),
    "frame_max": _Range(whole=True, low=4096, high=131_072),
}

#: redis-py's numeric URL parameters; the store's own timeouts come from STATE_TIMEOUT.
_REDIS_NUMBERS = {
    "db": _Range(whole=True, low=0, high=2**31 - 1),
    "socket_timeout": _Range(whole=False, low=0, high=3600, above_low=True),
    "socket_connect_timeout": _Range(whole=False, low=0, high=3600, above_low=True),
    "timeout": _Range(whole=False, low=0, high=3600, above_low=True),
    "health_check_interval": _Range(whole=True, low=0, high=86_400),
    "max_connections": _Range(whole=True, low=1, high=2**31 - 1),
}

_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def check_url(value: str, schemes: tuple[str, ...]) -> SplitResult:
    """The parts of ``value``, a URL with one of ``schemes``, a host and a valid port if any."""
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise ValueError(f"must be a URL starting with {' or '.join(s + '://' for s in schemes)}")
    if not parts.hostname:
        raise ValueError("must name a host")
    if "@" in parts.path + parts.query + parts.fragment:
        # A password with '?', '#' or '/' in it, not encoded: the rest of it was read as the path
        # or the query (and a host before it, from the user name), and an error naming a query
        # parameter would show part of it.
        raise ValueError("has '@' after its host: percent-encode the password (? as %3F, # as %23, / as %2F)")
    try:
        parts.port  # noqa: B018 - parsing the port validates it
    except ValueError:
        raise ValueError("has an invalid port") from None
    return parts


def _shown(name: str) -> str:
    """A query parameter's name as an error may show it: a name, not a fragment of a secret."""
    return name if re.fullmatch(r"[a-z_]{1,40}", name) else "(name not shown)"


def _query(parts: SplitResult) -> dict[str, str]:
    """The query string's parameters; a repeated one is an error (clients keep one or refuse)."""
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query: dict[str, str] = {}
    for name, value in pairs:
        if name in query:
            raise ValueError(f"repeats query parameter {_shown(name)}")
        query[name] = value
    return query


def _accepted_by(build: Callable[[str], object], name: str, value: str) -> bool:
    """Whether the client builds from a URL whose query is ``name=value``: its own parser has the
    last word (unknown names, pika's ``ssl_options`` naming missing files, ...)."""
    try:
        build(urlencode({name: value}))
    except Exception:  # each client raises its own mix of ValueError, TypeError, OSError, ...
        return False
    return True


def check_amqp_url(node: str) -> None:
    """One node of ``RABBITMQ_URL``: ``amqp[s]://user:pass@host:port/vhost?heartbeat=...``."""
    parts = check_url(node, ("amqp", "amqps"))
    if "/" in parts.path[1:]:
        raise ValueError("names a virtual host with a '/' in it: write it as %2F")
    for name, value in _query(parts).items():
        if name in _AMQP_NUMBERS:
            _AMQP_NUMBERS[name].check(name, value)
        if not _accepted_by(lambda q: pika.URLParameters(f"{parts.scheme}://localhost/?{q}"), name, value):
            raise ValueError(f"query parameter {_shown(name)} is unknown to pika or invalid")


def check_redis_url(value: str) -> None:
    """``STATE_URL`` on Redis: ``redis[s]://[user:pass@]host:port/db``, ``db`` a number."""
    parts = check_url(value, ("redis", "rediss"))
    query = _query(parts)
    if parts.path.strip("/"):
        if "db" in query:
            raise ValueError("names its database twice (path and ?db=)")
        try:
            _REDIS_NUMBERS["db"].check("db", parts.path[1:])
        except ValueError:
            raise ValueError(
                "must name its database by number (redis://host:6379/0), or none for 0"
            ) from None
    for name, text in query.items():
        if name in _REDIS_NUMBERS:
            _REDIS_NUMBERS[name].check(name, text)
        if not _accepted_by(_redis_connection(parts.scheme), name, text):
            raise ValueError(f"query parameter {_shown(name)} is unknown to redis-py or invalid")


def _redis_connection(scheme: str) -> Callable[[str], object]:
    """Build (without connecting) a redis-py connection from a URL with ``query``."""
    return lambda query: redis.ConnectionPool.from_url(f"{scheme}://localhost/?{query}").make_connection()


def check_sqlite_url(value: str) -> None:
    """``STATE_URL`` on SQLite: ``sqlite:///relative/path`` or ``sqlite:////absolute/path``."""
    parts = urlsplit(value)
    if parts.scheme != "sqlite" or parts.netloc or parts.path in ("", "/"):
        raise ValueError("must be redis://host:port/db or sqlite:///path/to/file.db")
    if parts.query or parts.fragment:
        raise ValueError("sqlite:///path takes no query string")


def check_smtp_url(value: str) -> None:
    """``SMTP_URL``: ``smtp://[user:pass@]host:port[?starttls=1]`` or ``smtps://...``; credentials
    only over TLS (``smtps://`` or ``starttls``): a login over plain text gives the password away."""
    parts = check_url(value, ("smtp", "smtps"))
    query = _query(parts)
    for name, text in query.items():
        if name != "starttls":
            raise ValueError(f"has an unknown query parameter {_shown(name)} (only starttls)")
        if text.lower() not in _TRUE + _FALSE:
            raise ValueError("query parameter starttls must be 1/0, true/false or yes/no")
        if parts.scheme == "smtps":
            raise ValueError("takes starttls with smtp:// only (smtps:// is TLS from the start)")
    tls = parts.scheme == "smtps" or query.get("starttls", "").lower() in _TRUE
    if (parts.username or parts.password) and not tls:
        raise ValueError(
            "has credentials but no TLS, so the password would cross the network in plain text: "
            "add ?starttls=1 (port 587) or use smtps:// (port 465)"
        )
