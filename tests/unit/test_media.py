"""The reference pipeline actor: image renditions with progress per stage, polled like an application."""

from __future__ import annotations

from actors import media


def test_the_time_limit_stays_below_the_consumer_timeout():
    assert media.make_renditions.options["time_limit"] < media.settings.rabbitmq_consumer_timeout_ms
