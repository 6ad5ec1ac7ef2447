"""Fixtures of the demo sweep's tests: the settings, a channel and a Redis client of their own, and
the leftovers a test made (deleted after it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import redis

from jobsystem.rabbitmq.broker import connection_urls
from jobsystem.settings import Settings, load_settings
from tests.integration.demo_sweep.leftovers import Made
from tests.support import TEST_REDIS_URL


@pytest.fixture
def settings() -> Settings:
    return load_settings({**os.environ, "STATE_URL": TEST_REDIS_URL})


@pytest.fixture
def channel(settings: Settings) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(connection_urls(settings)[0]))
    yield connection.channel()
    connection.close()


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(TEST_REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def made(settings: Settings, channel: Any, client: redis.Redis, tmp_path: Path) -> Iterator[Made]:
    made = Made(settings, channel, client, tmp_path)
    yield made
    made.delete_all()
