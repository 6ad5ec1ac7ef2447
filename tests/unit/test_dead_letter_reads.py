"""Dead-letter reads (list, show, export, re-index) whose connection is lost, or whose store fails,
midway end with a note naming the error by class, remove nothing and leave no file that looks
complete; and the purge a stopped retry names takes the letters it replayed, not a newer dead letter
of the same job. Without RabbitMQ, as ``test_dead_letter_stops``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from dramatiq import Message

from jobctl import dlq
from jobsystem.ops import dead_letters as ops
from jobsystem.store import StateStore
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.dead_letter_index import dead_letter_index
from tests.unit.dead_letter_standins import (
    LOST,
    RECORD,
    TWO_QUEUES,
    StandInQueues,
    letters_of,
    reader_lost_at_read,
)
from tests.unit.test_dlq_replay import _dead, _Queues

#: The note of a read whose connection was lost (pika's StreamLostError, its text an address).
READ_LOST = (
    "stopped: reading the dead letters failed, RabbitMQ closed or lost the connection (StreamLostError)"
)


@pytest.fixture
def lost(monkeypatch: pytest.MonkeyPatch) -> _Queues:
    """Two letters in each of :data:`TWO_QUEUES`, read by ``jobctl dlq``; the reader's connection
    is lost when the third letter is asked for."""
    queues = _Queues({name: letters_of(name, 2) for name in TWO_QUEUES})
    monkeypatch.setattr(ops, "Reader", reader_lost_at_read(queues, 2))
    monkeypatch.setattr(dlq, "Context", StandInQueues)
    return queues


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["list"], "2 dead letter(s) in 2 queue(s) so far"),
        (["list", "--json"], "2 dead letter(s) in 2 queue(s) so far"),
        (["show", "absent"], "dead letter absent not found so far"),
        (["export"], "exported 2 dead letter(s) so far"),
    ],
)
def test_a_read_whose_connection_is_lost_midway_ends_with_what_it_read_and_fails(
    lost: _Queues, command: list[str], said: str
) -> None:
    """jobctl ended with pika's traceback (its text RabbitMQ's address) and no count. It says what
    it read so far and why it stopped, by class, and exits 1; nothing was acked."""
    result = CliRunner().invoke(dlq.dlq, command)
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
    assert f"{said} ({READ_LOST}: nothing removed; run the command again)" in result.stderr
    assert "10.0.0.5" not in result.output and lost.acked == []


def test_an_export_to_a_file_stopped_midway_leaves_no_file_and_an_earlier_one_as_it_was(
    lost: _Queues, tmp_path: Path
) -> None:
    """The export wrote each letter to the file as it read it: stopped after two of four, the file
    held two well-formed lines, nothing to tell it from a whole export. It is written beside and
    renamed once whole: an earlier file of that name stays as it was, and nothing else is left."""
    path = tmp_path / "letters.jsonl"
    path.write_text("earlier\n")
    result = CliRunner().invoke(dlq.dlq, ["export", "-o", str(path)])
    assert result.exit_code == 1, result.output
    assert f"exported 2 dead letter(s) so far, {path} not written ({READ_LOST}" in result.stderr
    assert path.read_text() == "earlier\n" and list(tmp_path.iterdir()) == [path]


def test_an_export_to_a_file_is_written_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    queues = _Queues({name: letters_of(name, 2) for name in TWO_QUEUES})
    monkeypatch.setattr(ops, "Reader", queues.reader)
    monkeypatch.setattr(dlq, "Context", StandInQueues)
    path = tmp_path / "letters.jsonl"
    result = CliRunner().invoke(dlq.dlq, ["export", "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert len(path.read_text().splitlines()) == 4 and list(tmp_path.iterdir()) == [path]


@pytest.fixture
def indexed(store: StateStore) -> Any:
    """A broker of the environment ``p-`` whose dead-letter index (on each store backend) holds
    three letters of ``p-work``, as the queue holds them."""
    letters = letters_of("p-work.DLQ", 3)
    index = dead_letter_index(store)
    index.add([dead.index_entry() for dead in letters], ttl_ms=None, max_length=None)
    broker = SimpleNamespace(
        dead_letter_index=SimpleNamespace(backend=index),
        actors={"job": SimpleNamespace(queue_name="p-work")},
        environment="p-",
        middleware=[],
    )
    return SimpleNamespace(broker=broker, index=index, queues=_Queues({"p-work.DLQ": letters}))


def test_a_reindex_whose_connection_is_lost_midway_stops_and_leaves_the_index_as_it_was(
    indexed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-index raised pika's error (the dashboard answered "nothing done, or only part of
    it"); it raises ReadStopped, whose note says nothing was re-indexed. The index is as it was."""
    monkeypatch.setattr(ops, "Reader", reader_lost_at_read(indexed.queues, 2))
    with pytest.raises(ops.ReadStopped) as stopped:
        ops.reindex(indexed.broker, "p-work.DLQ")
    assert stopped.value.note == f"{READ_LOST}: nothing re-indexed; re-index again"
    assert stopped.value.error_class == "StreamLostError" and LOST not in str(stopped.value)
    assert indexed.index.counts() == {"p-work": 3}


def test_a_reindex_whose_store_fails_names_its_error_by_class(
    indexed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "Reader", indexed.queues.reader)

    def down(*args: Any, **kwargs: Any) -> None:
        try:
            raise ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused.")
        except ConnectionError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    monkeypatch.setattr(indexed.index, "replace", down)
    with pytest.raises(ops.ReadStopped) as stopped:
        ops.reindex(indexed.broker, "p-work.DLQ")
    assert stopped.value.note == (
        "stopped: the state store did not answer (StoreUnavailable: ConnectionError): the index of"
        " p-work is as it was; re-index again once the store answers"
    )


def test_a_purge_of_a_replay_count_leaves_a_newer_dead_letter_of_the_same_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stopped retry named the letter it replayed, to purge; the replay failed again before the
    purge, a newer dead letter of the same id: ``purge --yes ID`` removed both. ``--replays 0``, as
    the retry's summary says it, removes the one replayed only."""
    old: Message[Any] = Message("p-work", "job", (), {}, {})
    again = old.copy(options={"replays": 1})
    letters = [_dead("p-work.DLQ", m.encode(), RECORD, m.message_id) for m in (old, again)]
    queues = _Queues({TWO_QUEUES[0]: letters, TWO_QUEUES[1]: []})
    monkeypatch.setattr(ops, "Reader", queues.reader)
    monkeypatch.setattr(dlq, "Context", StandInQueues)
    result = CliRunner().invoke(dlq.dlq, ["purge", "--yes", "--replays", "0", old.message_id])
    assert result.exit_code == 0, result.output
    assert "purged 1 dead letter(s)" in result.stdout and queues.acked == [1]


def test_a_stopped_retry_names_the_purge_of_each_letter_by_its_replays() -> None:
    letters = letters_of("p-work.DLQ", 3)
    again = letters[2].body.replace(b'"options":{}', b'"options":{"replays":2}')
    letters[2] = dataclasses.replace(letters[2], body=again)
    outcome = ops.Outcome()
    outcome.note_unremoved(letters)
    first, second, third = (dead.message_id for dead in letters)
    assert outcome.purges() == [
        f"jobctl dlq purge --yes --replays 0 {first} {second}",
        f"jobctl dlq purge --yes --replays 2 {third}",
    ]
    assert outcome.notes[0].endswith(
        f"with jobctl dlq purge --yes --replays 0 ID...: {first} {second}"
        f" and jobctl dlq purge --yes --replays 2 ID...: {third}"
    )
