"""How many times a dead letter's job was replayed (``replays``) is shown wherever a dead letter
is: ``jobctl dlq list`` (table and ``--json``), ``jobctl dlq show``, and the dashboard's list and
job page (HTML and JSON), so the operator sees which letters ``purge --replays N`` takes; and
``list --replays N`` selects them, together with ``--queue`` and ``--actor``. Without RabbitMQ,
as ``test_dead_letter_reads``; the dashboard on both store backends."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from dramatiq import Message

from jobctl import dlq
from jobsystem.ops import dead_letters as ops
from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.rabbitmq.dead_letter_indexer import DeadLetterIndexer
from jobsystem.store import StateStore
from jobsystem.store.dead_letter_index import dead_letter_index
from tests.asgi import call
from tests.unit.dead_letter_standins import TWO_QUEUES, StandInQueues
from tests.unit.test_dashboard_app import dashboard
from tests.unit.test_dlq_replay import _dead, _Queues

NOT_A_MESSAGE = b"\xff not a message"


def letter(queue: str, actor: str, replays: int | None) -> DeadLetter:
    """A dead letter of ``queue`` (``p-work.DLQ``...) whose job ``actor`` had been replayed
    ``replays`` times (None: its body is not a message)."""
    message: Message[Any] = Message("p-work", actor, (), {}, {"replays": replays} if replays else {})
    record = {"x-dl-reason": "retries_exhausted", "x-dl-queue": queue.removesuffix(".DLQ")}
    record |= {"x-dl-actor": actor, "x-dl-environment": "p-"}
    body = message.encode() if replays is not None else NOT_A_MESSAGE
    return _dead(queue, body, record, message.message_id)


#: Four letters in :data:`TWO_QUEUES`: (queue, actor, replays).
LETTERS = [
    letter(TWO_QUEUES[0], "job", 0),
    letter(TWO_QUEUES[0], "job", 2),
    letter(TWO_QUEUES[0], "other", 2),
    letter(TWO_QUEUES[1], "job", 2),
    letter(TWO_QUEUES[1], "job", None),
]


class Scoped(StandInQueues):
    """``jobctl dlq``'s context over the stand-in queues that takes ``--queue`` (the queues read)
    and ``--actor`` (a filter) as the real one does."""

    def __init__(self, ids: tuple[str, ...], selected: Any, *, reading: bool = False) -> None:
        super().__init__(ids, selected, reading=reading)
        if selected.queue is not None:
            self.queues = [f"{selected.queue}.DLQ"]
        self.filters = dataclasses.replace(self.filters, actor=selected.actor)


@pytest.fixture
def jobctl(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``jobctl dlq`` over :data:`LETTERS`: ``run(*arguments)`` its result."""
    queues = _Queues({name: [d for d in LETTERS if d.dead_letter_queue == name] for name in TWO_QUEUES})
    monkeypatch.setattr(ops, "Reader", queues.reader)
    monkeypatch.setattr(dlq, "Context", Scoped)

    def run(*arguments: str) -> Any:
        result = CliRunner().invoke(dlq.dlq, list(arguments))
        assert result.exit_code == 0, result.output
        assert queues.acked == []
        return result

    return run


def test_list_shows_each_letters_replays_in_its_table_and_its_json(jobctl: Any) -> None:
    table = jobctl("list").stdout.splitlines()
    assert [re.findall(r"  replays=(\S+)  ", line) for line in table] == [["0"], ["2"], ["2"], ["2"], ["-"]]
    assert all("attempts=0  replays=" in line for line in table)  # the other columns as they were
    lines = [json.loads(line) for line in jobctl("list", "--json").stdout.splitlines()]
    assert [line["replays"] for line in lines] == [0, 2, 2, 2, None]
    assert set(lines[0]) == {*LETTERS[0].summary()} and "attempts" in lines[0]


def test_show_says_a_letters_replays(jobctl: Any) -> None:
    shown = jobctl("show", LETTERS[1].message_id).stdout
    assert re.search(r"^replays +2$", shown, re.MULTILINE), shown
    unknown = jobctl("show", LETTERS[4].message_id).stdout
    assert re.search(r"^replays +-$", unknown, re.MULTILINE), unknown


@pytest.mark.parametrize(
    ("filters", "listed"),
    [
        (["--replays", "2"], [1, 2, 3]),
        (["--replays", "0"], [0]),
        (["--replays", "2", "--actor", "job"], [1, 3]),
        (["--replays", "2", "--queue", "p-work"], [1, 2]),
        (["--replays", "2", "--queue", "p-work", "--actor", "job"], [1]),
        (["--replays", "1"], []),
    ],
)
def test_list_takes_the_replays_filter_with_the_queue_and_actor_filters(
    jobctl: Any, filters: list[str], listed: list[int]
) -> None:
    """What ``purge --replays N`` (with the same filters) would take, listed first."""
    lines = [json.loads(line) for line in jobctl("list", "--json", *filters).stdout.splitlines()]
    assert [line["message_id"] for line in lines] == [LETTERS[i].message_id for i in listed]


def test_the_dashboard_shows_each_letters_replays_in_its_list_and_on_its_job_page(store: StateStore) -> None:
    """Filed by the worker's indexer from the dead letter's body, as the dashboard lists them. The
    job page of a dead letter without a status record answered 500 (it read the record's progress)."""
    app, _, _ = dashboard(store)
    indexer = DeadLetterIndexer(store)
    failed_at = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "a1", "x-dl-failed-at": failed_at}
    again: Message[Any] = Message("t_emails", "a1", (), {}, {"replays": 3})
    indexer.record("t_emails", again.message_id, headers, again.encode())
    indexer.record("t_emails", "not-a-message", headers, NOT_A_MESSAGE)
    assert indexer.flush(10)
    listed = call(app, "GET", "/api/dead-letters").json()["dead_letters"]
    assert {d["message_id"]: d["replays"] for d in listed} == {again.message_id: 3, "not-a-message": None}
    page = call(app, "GET", "/dead-letters").text
    assert '<th class="n">attempts</th><th class="n">replays</th>' in page
    assert _row(page, again.message_id)[-2:] == ["0", "3"]  # attempts, replays
    assert _row(page, "not-a-message")[-2:] == ["0", "-"]
    detail = call(app, "GET", f"/api/jobs/{again.message_id}?queue=t_emails").json()
    assert detail["dead_letter"]["replays"] == 3
    job_page = call(
        app, "GET", f"/jobs/{again.message_id}?queue=t_emails"
    )  # its record expired, or never was
    assert job_page.status_code == 200, job_page.text  # the page read the record's fields: 500
    assert "0 attempts, replays 3, failed" in job_page.text


def _row(page: str, message_id: str) -> list[str]:
    """The numeric cells of the dead letters table's row of ``message_id``."""
    (row,) = [r for r in page.split("<tr>") if f'value="{message_id}"' in r]
    return re.findall(r'<td class="n">([^<]*)</td>', row)


def test_a_reindex_indexes_each_letters_replays(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard lists the index: a letter the re-index filed there keeps its replays too."""
    work = [d for d in LETTERS if d.dead_letter_queue == TWO_QUEUES[0]]
    monkeypatch.setattr(ops, "Reader", _Queues({TWO_QUEUES[0]: work}).reader)
    index = dead_letter_index(store)
    broker = SimpleNamespace(
        dead_letter_index=SimpleNamespace(backend=index),
        actors={"job": SimpleNamespace(queue_name="p-work")},
        environment="p-",
        middleware=[],
    )
    assert ops.reindex(broker, TWO_QUEUES[0]) == ops.Reindexed(3, 0)  # type: ignore[arg-type]
    assert [index.get("p-work", d.message_id).replays for d in work] == [0, 2, 2]  # type: ignore[union-attr]
