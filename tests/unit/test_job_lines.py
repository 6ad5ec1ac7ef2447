"""Lifecycle lines made without structlog's chain (jobsystem.observability.job_lines): the same line
as the ordinary path, in JSON and console format, scrubbed (whatever else is bound included), in
the same place and order; and the ordinary path wherever the chain would not take the short one."""

from __future__ import annotations

import contextvars
import datetime as dt
import io
import json
import logging
import multiprocessing
import re
from typing import Any

import dramatiq
import pytest
import structlog
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker
from dramatiq.compat import StreamablePipe
from hypothesis import given, settings
from hypothesis import strategies as st

from jobsystem.observability import job_lines
from jobsystem.observability.batched_stream import BatchedStream
from jobsystem.observability.job_lines import IsoStamps, write_job_line
from jobsystem.observability.logs import configure_logging
from jobsystem.settings import load_settings
from middleware.lifecycle import DEFAULT_LOGGER, JobLifecycle
from tests.pii_corpus import free_text, keyed, leaks

#: Bound while the job runs, as an application would: personal data, and names the chain sets.
BOUND: dict[str, Any] = {
    "customer_email": "ana.lopez@example.com",
    "note": free_text(),
    "customer": keyed(),
    "tenant": "acme",
    "level": "bound level",
    "timestamp": "bound timestamp",
    "logger": "bound logger",
    "duration_ms": "bound duration",
}
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?Z")


class Capture(logging.StreamHandler):  # type: ignore[type-arg]
    """Not a plain StreamHandler: the ordinary path (LogRecord, filters, ProcessorFormatter)."""


pytestmark = pytest.mark.usefixtures("logging_restored")


def _configure(stream: Any, log_format: str = "json", level: str = "INFO") -> logging.StreamHandler:  # type: ignore[type-arg]
    root = logging.getLogger()
    root.handlers = [logging.StreamHandler(stream)]
    configure_logging(load_settings({"LOG_FORMAT": log_format, "LOG_LEVEL": level}))
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    return handler


def _ordinary_handler(plain: logging.StreamHandler, stream: io.StringIO) -> None:  # type: ignore[type-arg]
    """Swap the root handler for one that the short paths leave alone, set up the same way."""
    capture = Capture(stream)
    capture.setFormatter(plain.formatter)
    capture.filters = list(plain.filters)
    logging.getLogger().handlers = [capture]


class Job:
    """A no-op job run through ``JobLifecycle``'s hooks, as a worker thread runs them."""

    def __init__(self) -> None:
        self.broker = StubBroker()

        @dramatiq.actor(queue_name="reports", broker=self.broker)
        def build_report() -> None:
            pass

        self.lifecycle = JobLifecycle(scrub=lambda v: v, clock=lambda: 100.0, write_line=write_job_line)
        self.message = MessageProxy(build_report.message())

    def run(self, bound: dict[str, Any] | None = None, exception: BaseException | None = None) -> None:
        """Run it with ``bound`` bound in structlog's context variables: the first half of it
        before the job starts (by the caller's scope), the rest while it runs (by the actor)."""
        items = list((bound or {}).items())
        half = len(items) // 2
        structlog.contextvars.bind_contextvars(**dict(items[:half]))
        self.lifecycle.before_process_message(self.broker, self.message)
        structlog.contextvars.bind_contextvars(**dict(items[half:]))
        self.lifecycle.after_process_message(self.broker, self.message, exception=exception)
        structlog.contextvars.unbind_contextvars(*(bound or {}))


def _json_pairs(output: str) -> list[list[tuple[str, Any]]]:
    """Each line's entries in order, the timestamp (made at each call) set aside."""
    lines = [json.loads(line, object_pairs_hook=list) for line in output.splitlines()]
    for line in lines:
        assert ISO.fullmatch(dict(line)["timestamp"])
    return [[(k, "<time>" if k == "timestamp" else v) for k, v in line] for line in lines]


@pytest.mark.parametrize("bound", [None, BOUND], ids=["job context", "personal data bound"])
def test_a_jobs_json_lines_are_the_ordinary_lines(emitted, bound):
    short, ordinary = io.StringIO(), io.StringIO()
    handler, job = _configure(short), Job()
    job.run(bound)
    assert emitted == []  # no LogRecord: the short path
    _ordinary_handler(handler, ordinary)
    job.lifecycle.write_line = None  # the same message, logged the ordinary way
    job.run(bound)
    assert len(emitted) == 2
    assert _json_pairs(short.getvalue()) == _json_pairs(ordinary.getvalue())
    assert leaks(short.getvalue()) == []
    started, succeeded = (json.loads(line) for line in short.getvalue().splitlines())
    assert started["event"] == "job_started" and succeeded["duration_ms"] == 0.0
    assert started["actor"] == "build_report" and started["queue"] == "reports" and started["attempt"] == 1
    if bound:
        assert succeeded["customer_email"] == "[email]" and succeeded["customer"]["full_name"] == "[name]"
        assert succeeded["level"] == "info" and succeeded["tenant"] == "acme"
        assert started["customer_email"] == "[email]" and started["tenant"] == "acme"  # bound before


#: Bound values that cannot change (strings): a line holding only such values is made at send time.
UNCHANGING = {key: value for key, value in BOUND.items() if type(value) is str}


def _counted_scrubs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The events the installed job lines scrubbed (each line is scrubbed when it is made)."""
    lines = job_lines._installed
    assert lines is not None
    made, mapping = [], lines.memo.mapping

    def counted(event: Any, made_here: Any = ()) -> Any:
        made.append(event["event"])
        return mapping(event, made_here)

    monkeypatch.setattr(lines.memo, "mapping", counted)
    return made


@pytest.mark.parametrize("bound", [None, UNCHANGING], ids=["job context", "personal data bound"])
def test_lines_made_when_their_batch_is_sent_are_the_ordinary_lines(emitted, bound, monkeypatch):
    """In a worker (its stream batched), the first line of a batch (an idle worker's job_started)
    is scrubbed and rendered when the batch leaves, not on the job's thread; a line joining a
    pending batch is made at once. The same lines as the ordinary path's, none leaking."""
    batched, ordinary = io.StringIO(), io.StringIO()
    handler, job = _configure(BatchedStream(batched, interval=600)), Job()
    made = _counted_scrubs(monkeypatch)
    job.run(bound)
    assert made == ["job_succeeded"] and batched.getvalue() == ""  # job_started queued as its maker
    handler.stream.flush()
    assert made == ["job_succeeded", "job_started"] and emitted == []
    _ordinary_handler(handler, ordinary)
    job.lifecycle.write_line = None
    job.run(bound)
    assert _json_pairs(batched.getvalue()) == _json_pairs(ordinary.getvalue())
    assert leaks(batched.getvalue()) == []
    if bound:
        started = json.loads(batched.getvalue().splitlines()[0])
        assert started["customer_email"] == "[email]" and started["tenant"] == "acme"


def test_a_line_holding_a_value_that_can_change_is_made_at_once(monkeypatch):
    """A container bound (it could change before the batch leaves) is scrubbed as it is now."""
    batched = io.StringIO()
    handler = _configure(BatchedStream(batched, interval=600))
    made = _counted_scrubs(monkeypatch)
    customer: dict[str, Any] = {"tier": "gold"}
    Job().run({"customer": customer, "tenant": "acme"})  # the customer bound before the job starts
    assert made == ["job_started", "job_succeeded"]
    customer["email"] = "ana.lopez@example.com"  # changed after the lines were made
    handler.stream.flush()
    customers = [json.loads(line)["customer"] for line in batched.getvalue().splitlines()]
    assert customers == [{"tier": "gold"}] * 2


def test_a_scrubber_that_fails_when_the_batch_leaves_scrubs_the_event_whole_as_the_chain_would(
    monkeypatch,
):
    batched, ordinary = io.StringIO(), io.StringIO()
    handler, job = _configure(BatchedStream(batched, interval=600)), Job()
    job.run(UNCHANGING)
    lines = job_lines._installed
    assert lines is not None

    def failing(key: Any, value: Any) -> Any:
        raise RecursionError("odd value")

    monkeypatch.setattr(lines.memo.scrubber, "item", failing)  # after the lines were queued
    handler.stream.flush()
    _ordinary_handler(handler, ordinary)
    job.lifecycle.write_line = None
    job.run(UNCHANGING)
    assert _json_pairs(batched.getvalue()) == _json_pairs(ordinary.getvalue())
    assert leaks(batched.getvalue()) == []


def test_a_jobs_console_lines_are_the_ordinary_lines(emitted):
    short, ordinary = io.StringIO(), io.StringIO()
    handler, job = _configure(short, "console"), Job()
    job.run(BOUND)
    assert emitted == []
    _ordinary_handler(handler, ordinary)
    job.lifecycle.write_line = None
    job.run(BOUND)
    assert len(emitted) == 2
    assert ISO.sub("<time>", short.getvalue()) == ISO.sub("<time>", ordinary.getvalue())
    assert "job_succeeded" in short.getvalue() and leaks(short.getvalue()) == []


def test_the_chain_is_not_run_for_a_jobs_lines(monkeypatch):
    calls: list[str] = []
    original = structlog.stdlib.BoundLogger.info

    def spy(self: Any, event: str, *args: Any, **kw: Any) -> Any:
        calls.append(event)
        return original(self, event, *args, **kw)

    monkeypatch.setattr(structlog.stdlib.BoundLogger, "info", spy)
    stream = io.StringIO()
    _configure(stream)
    Job().run()
    assert calls == []
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["job_started", "job_succeeded"]


def test_a_value_bound_again_under_the_same_key_is_scrubbed_again():
    stream = io.StringIO()
    _configure(stream)
    customer: dict[str, Any] = {"tier": "gold"}
    for note in ("nothing yet", "call +44 20 7946 0958", "nothing yet", "mail ana.lopez@example.com"):
        Job().run({"note": note, "customer": customer})
        customer["email"] = "ana.lopez@example.com"  # the same dict, changed: scrubbed as it is now
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    notes = [line["note"] for line in lines[1::2]]
    assert notes == ["nothing yet", "call [phone]", "nothing yet", "mail [email]"]
    assert lines[-1]["customer"] == {"tier": "gold", "email": "[email]"}
    assert leaks(stream.getvalue()) == []


def test_a_failed_job_and_an_exception_take_the_ordinary_path(emitted):
    stream = io.StringIO()
    _configure(stream)
    Job().run(exception=ValueError("no report for ana.lopez@example.com"))
    assert [r.levelno for r in emitted] == [logging.WARNING]  # job_failed; job_started took the short path
    try:
        raise RuntimeError("report for ana.lopez@example.com")
    except RuntimeError as error:
        assert not write_job_line(DEFAULT_LOGGER, "job_started", {"exc_info": error})
        structlog.contextvars.bind_contextvars(stack_info=True)
        assert not write_job_line(DEFAULT_LOGGER, "job_started", {})
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["job_started", "job_failed"]
    assert lines[1]["error"] == "no report for [email]" and lines[1]["exc_type"] == "ValueError"


def test_warning_level_writes_nothing(emitted):
    stream = io.StringIO()
    _configure(stream, level="WARNING")
    assert write_job_line(DEFAULT_LOGGER, "job_started", {})  # dropped, as filter_by_level drops it
    Job().run()
    assert stream.getvalue() == "" and emitted == []


def test_where_the_chain_would_not_take_the_short_path_the_caller_logs_the_ordinary_way(emitted):
    stream = io.StringIO()
    handler = _configure(stream)
    assert not write_job_line("jobs.other", "job_started", {})  # a logger DirectLines does not serve
    _ordinary_handler(handler, stream)
    assert not write_job_line(DEFAULT_LOGGER, "job_started", {})  # a handler that is not a plain one
    Job().run()
    assert [json.loads(r.msg)["event"] if isinstance(r.msg, str) else r.msg["event"] for r in emitted] == [
        "job_started",
        "job_succeeded",
    ]
    _configure(stream)
    with structlog.testing.capture_logs() as captured:  # a test capturing structlog's events
        assert not write_job_line(DEFAULT_LOGGER, "job_started", {})
        Job().run()
    assert [entry["event"] for entry in captured] == ["job_started", "job_succeeded"]
    assert write_job_line(DEFAULT_LOGGER, "job_started", {})  # the chain is back
    structlog.reset_defaults()
    assert not write_job_line(DEFAULT_LOGGER, "job_started", {})


def test_extra_processors_leave_every_event_to_the_chain():
    root = logging.getLogger()
    root.handlers = [logging.StreamHandler(io.StringIO())]
    settings = load_settings({"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"})
    configure_logging(settings, extra_processors=[lambda logger, name, event_dict: event_dict])
    assert not write_job_line(DEFAULT_LOGGER, "job_started", {})


def test_a_scrubber_that_fails_on_an_entry_leaves_the_event_to_the_chain(monkeypatch):
    stream = io.StringIO()
    _configure(stream)
    lines = job_lines._installed
    assert lines is not None

    def failing(key: Any, value: Any) -> Any:
        raise RecursionError("odd value")

    monkeypatch.setattr(lines.memo.scrubber, "item", failing)
    assert not write_job_line(DEFAULT_LOGGER, "job_started", {"note": "something new"})
    assert stream.getvalue() == ""


def test_lines_go_to_the_worker_pipe_in_order_with_other_writes():
    reader, writer = multiprocessing.Pipe(duplex=False)
    handler = _configure(StreamablePipe(writer))  # type: ignore[no-untyped-call]  # as in a worker: batched
    assert type(handler.stream) is BatchedStream
    handler.stream.interval = 600
    Job().run()
    assert not reader.poll(0.1)  # held in the batch, as DirectLines' lines are
    logging.getLogger("dramatiq.worker").warning("something odd")
    message = reader.recv_bytes().decode()
    assert [json.loads(line)["event"] for line in message.splitlines()] == [
        "job_started",
        "job_succeeded",
        "something odd",
    ]
    writer.close()
    reader.close()


@pytest.mark.parametrize(
    "moment",
    [
        dt.datetime(2026, 12, 1, 14, 9, 15, 123456, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 1, 14, 9, 15, 0, tzinfo=dt.UTC),  # a whole second: no fraction
        dt.datetime(2026, 12, 1, 14, 9, 15, 1, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(2028, 2, 29, 0, 0, 0, 500000, tzinfo=dt.UTC),
    ],
)
def test_timestamps_are_written_as_structlogs_iso_utc_timestamper_writes_them(moment):
    nanos = (int(moment.replace(microsecond=0).timestamp()) * 1_000_000 + moment.microsecond) * 1000 + 999
    stamps = IsoStamps(clock=lambda: nanos)
    expected = moment.isoformat().replace("+00:00", "Z")  # what TimeStamper(fmt="iso", utc=True) does
    assert stamps() == expected and stamps() == expected  # the second from the formatted second


def test_timestamps_read_the_clock_structlog_reads():
    stamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    before = stamper(None, "info", {})["timestamp"]
    ours = IsoStamps()()
    after = stamper(None, "info", {})["timestamp"]
    assert ISO.fullmatch(ours)
    parsed = [dt.datetime.fromisoformat(stamp) for stamp in (before, ours, after)]
    assert parsed == sorted(parsed)


#: Bindings to make, in order: a structlog key and its value (Ellipsis: unbound, as structlog's
#: ``unbind_contextvars`` leaves it), or another library's variable (key None).
_bindings = st.lists(
    st.tuples(
        st.one_of(st.none(), st.sampled_from(["", "event", "message_id", "actor", "a", "b", "level"])),
        st.one_of(st.just(Ellipsis), st.integers(), st.text(max_size=5)),
    ),
    max_size=12,
)
_OTHER_VARS: list[contextvars.ContextVar[Any]] = [
    contextvars.ContextVar(f"other_library_{i}") for i in range(12)
]


@settings(max_examples=300, deadline=None)
@given(bindings=_bindings, fields=st.dictionaries(st.sampled_from(["event", "a", "x"]), st.integers()))
def test_bound_context_merges_entry_for_entry_in_structlogs_order(bindings, fields):
    """Whatever is bound (unbound again, rebound, among other libraries' variables), BoundContext
    leaves the event dict exactly as structlog's merge_contextvars does: same keys, same order."""
    merge = job_lines.BoundContext(max_vars=5)  # small: its kept names are dropped on the way

    def check() -> None:
        for i, (key, value) in enumerate(bindings):
            if key is None:
                _OTHER_VARS[i].set(value)
            else:
                structlog.contextvars.bind_contextvars(**{key: value})
            ours = list(merge(None, "info", dict(fields)).items())
            theirs = list(structlog.contextvars.merge_contextvars(None, "info", dict(fields)).items())
            assert ours == theirs

    contextvars.copy_context().run(check)
