"""Reads of the dead letters (list, show, export, re-index) whose connection is lost midway, on the
real RabbitMQ and Redis: they stop with a note naming the error by class, and lose nothing: the
letters read go back to their queue, and a re-index leaves the index as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from jobsystem.ops import dead_letters as ops
from jobsystem.ops.dead_letter_reader import DeadLetter, Reader
from tests.senders import publish_dead_letters
from tests.support import wait_for

COUNT = 4


@pytest.fixture
def lost_after(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``lose(reads)``: the reader's connection closes (as a RabbitMQ restart drops it) once it
    has read ``reads`` letters, holding them unacked."""

    def lose(reads: int) -> None:
        stream = Reader.stream

        def streamed(reader: Reader, name: str) -> Iterator[tuple[DeadLetter, int]]:
            for count, item in enumerate(stream(reader, name), 1):
                yield item
                if count == reads:
                    reader.connection.close()

        monkeypatch.setattr(Reader, "stream", streamed)

    return lose


def test_a_listing_whose_connection_is_lost_midway_stops_and_its_letters_stay(queues, prefix, lost_after):
    broker = queues.broker
    dead = publish_dead_letters(broker, f"{prefix}listed", COUNT)
    lost_after(2)
    read: list[DeadLetter] = []
    with pytest.raises(ops.ReadStopped) as stopped:
        for letter in ops.read(broker, [dead], ops.Filters()):
            read.append(letter)
    assert len(read) == 2 and stopped.value.note.startswith(
        "stopped: reading the dead letters failed, RabbitMQ closed or lost the connection ("
    )
    wait_for(lambda: queues.depth(dead) == COUNT, what="the letters read back in their queue")


def test_a_reindex_whose_connection_is_lost_midway_leaves_the_index_and_the_letters(
    queues, prefix, lost_after
):
    broker = queues.broker
    queue = f"{prefix}reindexed"
    dead = publish_dead_letters(broker, queue, COUNT)
    lost_after(COUNT - 1)
    with pytest.raises(ops.ReadStopped, match=r"nothing re-indexed; re-index again$"):
        ops.reindex(broker, dead)
    assert broker.dead_letter_index.backend.counts() == {queue: COUNT}
    wait_for(lambda: queues.depth(dead) == COUNT, what="the letters read back in their queue")
