"""Review of fix/sentryaddr: lines Sentry takes (INFO and WARNING as breadcrumbs, ERROR as events)
must not name a dependency's address; the fix's rule, "the store named by its setting and kind,
not its label (its address)", was applied to the outage lines only. A worker's boot line and a
bulk send's failover line still hand Sentry the Redis URL or RabbitMQ's host and port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sentry_sdk
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from jobsystem.rabbitmq.bulk import send_bulk
from middleware.store_check import StoreCheck
from tests.amqp_server import fake_rabbitmq
from tests.servers import free_port, sent_to_sentry
from tests.support import fresh_store
from tests.unit.test_bulk import Recorder, messages


@pytest.fixture(autouse=True)
def no_breadcrumbs_kept() -> Iterator[None]:
    """``sent_to_sentry`` leaves the process's breadcrumbs in its scopes: this file's addresses must
    not reach the events of another test (``test_outage_sentry_addresses`` asserts none is sent)."""
    yield
    for scope in (
        sentry_sdk.get_isolation_scope(),
        sentry_sdk.get_current_scope(),
        sentry_sdk.get_global_scope(),
    ):
        scope.clear_breadcrumbs()


@pytest.mark.xfail(
    strict=True,
    reason="review1: state_store_ready (INFO, a breadcrumb) names the store by its label "
    "(middleware/store_check.py:83,86)",
)
def test_a_worker_booting_on_redis_sends_sentry_no_store_address(
    tmp_path: Path, logging_restored: None
) -> None:
    with fresh_store("redis", tmp_path) as store:
        assert "://" in store.label and ":6379" in store.label  # redis://<host>:<port>/<db>
        sent, log = sent_to_sentry(lambda: StoreCheck(store, setting="STATE_URL").after_process_boot(None))  # type: ignore[arg-type]
    assert "state_store_ready" in sent and "state_store_ready" in log  # the breadcrumb went
    assert store.label not in sent, sent


@pytest.mark.xfail(
    strict=True,
    reason="review1: bulk_send_node_unreachable (WARNING) names the node's host:port and pika's "
    "text (jobsystem/rabbitmq/bulk.py:369-371)",
)
def test_a_bulk_send_passing_over_a_node_sends_sentry_no_node_address(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    refused = f"localhost:{free_port()}"  # nothing listens there: refused at once
    batch = messages(2)

    def failover() -> None:
        with fake_rabbitmq() as rabbit:
            url = f"amqp://guest:guest@{refused}/%2F?connection_attempts=1"
            broker = RabbitmqBroker(url=[url, rabbit.url()], middleware=[Recorder()])
            monkeypatch.setattr(broker, "declare_queue", lambda queue_name, ensure=False: None)
            assert send_bulk(batch, broker=broker, timeout=5) == batch  # all sent on the second node
            assert rabbit.published == [m.message_id for m in batch]

    sent, _ = sent_to_sentry(failover)
    assert "bulk_send_node_unreachable" in sent  # the breadcrumb went
    assert refused not in sent, sent
