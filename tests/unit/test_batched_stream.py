"""Lifecycle lines go to Dramatiq's log pipe in batches (jobsystem.observability.batched_stream):
in order with every other write, sent when full, after a short interval, at worker shutdown and at
exit, and never twice across a fork."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest
import structlog
from dramatiq.compat import StreamablePipe

from jobsystem.observability.batched_stream import BatchedStream, flush_batched_streams
from jobsystem.observability.direct_lines import DirectLines
from jobsystem.observability.logs import configure_logging
from jobsystem.settings import load_settings
from jobsystem.startup import _in_dramatiq_worker
from middleware.lifecycle import DEFAULT_LOGGER, JobLifecycle
from tests.support import BIN, ROOT, wait_for

FIELDS = {"message_id": "6a1f0c3e-2b4d-4f5a-9c8e-7d6b5a4c3b2a", "attempt": 1}


class Recorder:
    """A stream that keeps each ``write`` apart, as a pipe keeps each message."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


pytestmark = pytest.mark.usefixtures("logging_restored")


def test_lines_wait_and_an_ordinary_write_sends_them_first_in_one_write():
    recorder = Recorder()
    stream = BatchedStream(recorder, interval=600)
    stream.write_later("started\n")
    stream.write_later("succeeded\n")
    assert recorder.writes == []
    stream.write("warning\n")
    assert recorder.writes == ["started\nsucceeded\nwarning\n"]
    stream.write("error\n")  # nothing pending: written as it is
    assert recorder.writes[-1] == "error\n"


def test_lines_made_at_send_time_keep_their_place_and_one_that_fails_loses_only_itself():
    recorder = Recorder()
    stream = BatchedStream(recorder, interval=600)

    def broken() -> str:
        raise ValueError("a maker must not raise")

    stream.write_later("started\n")
    stream.write_later(lambda: "made later\n")
    stream.write_later(broken)
    stream.write_later("succeeded\n")
    assert recorder.writes == []
    stream.write("warning\n")
    assert recorder.writes == ["started\nmade later\nsucceeded\nwarning\n"]


def test_a_line_made_at_send_time_is_made_once_for_every_batched_stream():
    recorders = [Recorder(), Recorder()]
    handlers = [logging.StreamHandler(BatchedStream(r, interval=600)) for r in recorders]
    handlers[1].terminator = "\r\n"
    made: list[str] = []

    def make() -> str:
        made.append("x")
        return "line"

    assert DirectLines.write_later(make, handlers)
    for handler in handlers:
        handler.stream.flush()
    assert made == ["x"] and [r.writes for r in recorders] == [["line\n"], ["line\r\n"]]
    plain = [logging.StreamHandler(Recorder())]
    assert not DirectLines.write_later(lambda: "line", [*handlers, *plain])  # made now, by the caller
    handlers[0].stream.write_later("pending\n")
    assert not DirectLines.write_later(lambda: "line", handlers)  # a batch pending: made now


def test_lines_are_sent_when_they_pass_the_size():
    recorder = Recorder()
    stream = BatchedStream(recorder, max_chars=30, interval=600)
    for i in range(5):
        stream.write_later(f"line {i:04d}\n")  # 10 characters each
    assert recorder.writes == ["line 0000\nline 0001\nline 0002\n"]
    stream.flush()
    assert recorder.writes == ["line 0000\nline 0001\nline 0002\n", "line 0003\nline 0004\n"]


def test_lines_are_sent_after_the_interval_together():
    recorder = Recorder()
    stream = BatchedStream(recorder, interval=0.05)
    stream.write_later("one\n")
    stream.write_later("two\n")
    wait_for(lambda: recorder.writes, timeout=5, what="the flusher thread")
    assert recorder.writes == ["one\ntwo\n"]
    stream.write_later("three\n")  # the thread keeps serving
    wait_for(lambda: len(recorder.writes) == 2, timeout=5, what="the second batch")
    assert recorder.writes[1] == "three\n"


class BlockingRecorder(Recorder):
    """A pipe whose reader is slow: a ``write`` waits until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        assert self.release.wait(30), "the test never released the write"
        return super().write(text)


def test_queueing_a_line_does_not_wait_for_a_send_in_progress():
    """Every worker thread logs: none may wait while another sends (a full pipe can take ms)."""
    recorder = BlockingRecorder()
    stream = BatchedStream(recorder, interval=600)
    sender = threading.Thread(target=stream.write, args=("warning\n",))
    sender.start()
    assert recorder.entered.wait(10), "the ordinary write never reached the stream"
    queued = threading.Event()

    def write_a_line_later() -> None:
        stream.write_later("line\n")
        queued.set()

    writer = threading.Thread(target=write_a_line_later)
    writer.start()
    try:
        assert queued.wait(10), "write_later waited for the send in progress"
    finally:
        recorder.release.set()
        sender.join(10)
        writer.join(10)
    stream.flush()
    assert recorder.writes == ["warning\n", "line\n"]


def test_lines_queued_by_many_threads_during_sends_are_each_sent_once_in_their_order():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes: races show up
    try:
        _many_threads_queue_and_send()
    finally:
        sys.setswitchinterval(interval)


def _many_threads_queue_and_send() -> None:
    recorder = Recorder()
    stream = BatchedStream(recorder, max_chars=200, interval=0.001)
    start = threading.Barrier(5)

    def lines(name: str) -> None:
        start.wait()
        for i in range(2000):
            stream.write_later(f"{name} {i}\n")

    def warnings() -> None:  # ordinary writes, each sending what is queued
        start.wait()
        for _ in range(200):
            stream.write("w\n")

    threads = [threading.Thread(target=lines, args=(f"t{n}",)) for n in range(4)]
    threads.append(threading.Thread(target=warnings))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stream.flush()
    sent = "".join(recorder.writes).splitlines()
    assert sent.count("w") == 200
    for n in range(4):
        assert [line for line in sent if line.startswith(f"t{n} ")] == [f"t{n} {i}" for i in range(2000)]


def test_an_interrupt_while_a_batch_is_made_loses_none_of_its_lines():
    """A job's time limit or cancellation is raised in its thread wherever it is, also while that
    thread sends the batch its log line filled: the lines stay queued for the next send."""
    from dramatiq.threading import Interrupt

    recorder = Recorder()
    stream = BatchedStream(recorder, interval=600)
    interrupted: list[bool] = []

    def made_later() -> str:
        if not interrupted:
            interrupted.append(True)
            raise Interrupt("the time limit, landing here")
        return "made\n"

    stream.write_later("first\n")
    stream.write_later(made_later)
    stream.write_later("last\n")
    with pytest.raises(Interrupt):
        stream.send_pending()
    assert recorder.writes == [] and stream.pending
    stream.send_pending()
    assert recorder.writes == ["first\nmade\nlast\n"] and not stream.pending


def test_worker_shutdown_sends_what_is_pending():
    recorder = Recorder()
    stream = BatchedStream(recorder, interval=600)
    stream.write_later("last job\n")
    calls: list[str] = []
    lifecycle = JobLifecycle(scrub=lambda value: value, flush_logs=lambda: calls.append("flush"))
    lifecycle.after_worker_shutdown(None, None)  # type: ignore[arg-type]
    assert calls == ["flush"]
    flush_batched_streams()  # what the stack hands JobLifecycle
    assert recorder.writes == ["last job\n"]


def test_pending_lines_are_sent_at_interpreter_exit():
    script = (
        "import sys\n"
        "from jobsystem.observability.batched_stream import BatchedStream\n"
        "stream = BatchedStream(sys.stdout, interval=600)\n"
        "stream.write_later('first\\n'); stream.write_later('second\\n')\n"
    )
    result = subprocess.run(
        [str(BIN / "python"), "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "first\nsecond\n"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_sends_only_its_own_lines_and_can_write_while_the_parent_held_the_lock():
    read_fd, write_fd = os.pipe()

    written: list[str] = []

    class FdStream:
        def write(self, text: str) -> int:
            sent = os.write(write_fd, text.encode())
            written.append(text)
            return sent

    stream = BatchedStream(FdStream(), interval=0.05)
    stream.write_later("parent pending\n")
    stream._lock.acquire()  # as if a thread of the parent were sending at the moment of the fork
    pid = os.fork()
    if pid == 0:  # the child: a fresh lock, nothing pending, a flusher of its own
        signal.alarm(10)  # a deadlock ends the child, and the test fails on its exit status
        stream.write_later("child line\n")
        deadline = 200

        # Until its flusher wrote the line (taken from the pending list is not written yet).
        def child_line_written() -> bool:
            return "child line\n" in "".join(written)

        while not child_line_written() and deadline:
            threading.Event().wait(0.05)
            deadline -= 1
        os._exit(0 if child_line_written() else 3)
    stream._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    stream.flush()
    os.close(write_fd)
    with os.fdopen(read_fd) as reader:
        assert sorted(reader.read().splitlines()) == ["child line", "parent pending"]


def test_under_dramatiq_lifecycle_lines_and_a_warning_reach_the_parent_in_order_in_one_message():
    reader, writer = multiprocessing.Pipe(duplex=False)
    pipe: Any = StreamablePipe(writer)  # type: ignore[no-untyped-call]  # a text stream to its users
    sys.stderr = pipe  # as Dramatiq's worker process has it
    root = logging.getLogger()
    root.handlers = [logging.StreamHandler(pipe)]
    configure_logging(load_settings({"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"}))
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler) and type(handler.stream) is BatchedStream
    assert sys.stderr is handler.stream  # print() to stderr keeps its place too
    assert _in_dramatiq_worker()  # a bad setting found later still exits quietly with code 2
    handler.stream.interval = 600
    log = structlog.get_logger(DEFAULT_LOGGER)
    log.info("job_started", **FIELDS)
    log.info("job_succeeded", duration_ms=1.5, **FIELDS)
    assert not reader.poll(0.2)  # held, not sent
    logging.getLogger("dramatiq.worker").warning("something odd")
    message = reader.recv_bytes().decode()
    lines: list[dict[str, Any]] = [json.loads(line) for line in message.splitlines()]
    assert [line["event"] for line in lines] == ["job_started", "job_succeeded", "something odd"]
    assert message.endswith("\n") and not reader.poll(0.1)
    writer.close()
    reader.close()


def test_configuring_twice_wraps_the_pipe_once():
    reader, writer = multiprocessing.Pipe(duplex=False)
    root = logging.getLogger()
    root.handlers = [logging.StreamHandler(StreamablePipe(writer))]  # type: ignore[no-untyped-call]
    settings = load_settings({"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"})
    configure_logging(settings)
    first = root.handlers[0].stream  # type: ignore[attr-defined]
    configure_logging(settings)
    assert root.handlers[0].stream is first and type(first.stream) is StreamablePipe  # type: ignore[attr-defined]
    writer.close()
    reader.close()
