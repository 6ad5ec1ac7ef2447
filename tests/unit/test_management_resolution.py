"""The management call's deadline covers name resolution, and a SOCKS proxy is refused.

``getaddrinfo`` of the management host (or of a proxy's) ran in the calling thread, before the
deadline's watch could reach any socket: a resolver that did not answer held a health check or
a dashboard request for as long as it took. Here a fake resolver blocks on an event for the
names it is given, as a DNS server that never answers does; every other name resolves as usual.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from jobsystem.ops.management_http import ManagementTimeout, SocksProxyRefused, call_json
from jobsystem.ops.resolver import MAX_LOOKUPS
from jobsystem.settings import SettingsError, load_settings
from tests.support import wait_for, within
from tests.unit.test_management_deadline import DEADLINE_S, trickling_server

SLOW = "management.slow-dns.test"
SLOW_PROXY = "proxy.slow-dns.test"


@pytest.fixture(autouse=True)
def no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def hanging_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """``getaddrinfo`` of :data:`SLOW` and :data:`SLOW_PROXY` blocks until the test ends (then
    fails, as a resolver that gives up does); what it was asked, by name."""
    real, release, asked = socket.getaddrinfo, threading.Event(), {SLOW: 0, SLOW_PROXY: 0}
    counting = threading.Lock()

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in asked:
            with counting:
                asked[host] += 1
            release.wait(60)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        yield asked
    finally:
        release.set()
        wait_for(lambda: not _resolver_threads(), what="the lookup threads to end once answered")


def _resolver_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "resolver" and t.is_alive()]


def _given_up(url: str) -> None:
    outcome = within(DEADLINE_S + 5, lambda: call_json("GET", url, DEADLINE_S))
    assert isinstance(outcome, ManagementTimeout), outcome


def test_a_management_host_whose_name_does_not_resolve_is_given_up_at_the_deadline(hanging_resolver):
    _given_up(f"http://{SLOW}:15672/api/queues")
    assert hanging_resolver[SLOW] == 1


def test_an_https_management_host_whose_name_does_not_resolve_is_given_up_at_the_deadline(
    hanging_resolver,
):
    _given_up(f"https://{SLOW}:15671/api/queues")
    assert hanging_resolver[SLOW] == 1


def test_a_proxy_whose_name_does_not_resolve_is_given_up_at_the_deadline(monkeypatch, hanging_resolver):
    monkeypatch.setenv("HTTP_PROXY", f"http://{SLOW_PROXY}:3128")
    _given_up("http://127.0.0.1:1/api/queues")  # only the proxy's name is looked up
    assert hanging_resolver[SLOW_PROXY] == 1


def test_lookups_that_hang_hold_a_few_threads_not_one_per_call(hanging_resolver):
    """Calls after the first MAX_LOOKUPS wait for a free lookup thread, until their deadline."""
    calls = MAX_LOOKUPS + 3
    outcomes: list[Any] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(within(DEADLINE_S + 5, _slow_call)), daemon=True)
        for _ in range(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S + 10)
    assert len(outcomes) == calls and all(isinstance(o, ManagementTimeout) for o in outcomes), outcomes
    assert hanging_resolver[SLOW] == MAX_LOOKUPS and len(_resolver_threads()) == MAX_LOOKUPS


def _slow_call() -> Any:
    return call_json("GET", f"http://{SLOW}:15672/api/queues", DEADLINE_S)


def test_a_name_with_several_addresses_is_connected_to_by_the_one_that_answers():
    """``localhost`` is ::1 and 127.0.0.1 on most hosts; the server listens on the second only."""
    with trickling_server("none") as server:
        assert len(call_json("GET", f"http://localhost:{server.port}/api/queues", DEADLINE_S)) == 10


@pytest.mark.parametrize("variable", ["ALL_PROXY", "https_proxy"])
def test_a_socks_proxy_is_refused_naming_its_variable(monkeypatch, variable):
    """PySocks' connections resolve names and read the proxy's answers where no deadline reaches:
    refused at each call and at start-up, naming the variable (never its value: a password)."""
    monkeypatch.setenv(variable, "socks5h://user:proxy-secret@127.0.0.1:1")
    outcome = within(DEADLINE_S + 5, lambda: call_json("GET", "https://127.0.0.1:1/api/queues", DEADLINE_S))
    assert isinstance(outcome, SocksProxyRefused) and variable in str(outcome), outcome
    with pytest.raises(SettingsError) as refused:
        load_settings({"RABBITMQ_MANAGEMENT_URL": "https://rabbit.example:15671"})
    assert [p.split(":")[0] for p in refused.value.problems] == [variable]
    assert "proxy-secret" not in str(outcome) + str(refused.value)


def test_a_socks_proxy_the_management_host_bypasses_is_no_matter(monkeypatch):
    monkeypatch.setenv("ALL_PROXY", "socks5h://127.0.0.1:1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    load_settings({})  # the management API on 127.0.0.1 by default: reached directly
    with trickling_server("none") as server:
        assert len(call_json("GET", f"http://127.0.0.1:{server.port}/api/queues", DEADLINE_S)) == 10
