"""Review of fix/sentryaddr: ``test_bulk``'s ``assert_no_traceback`` promises "nothing logged with a
traceback, pika's records included", reading the records at the root logger (``caplog``). Since
the merge the handler ``PikaAddresses``, installed on the ``pika`` logger by ``configure_logging``
(which ``import actors`` at the top of ``test_bulk`` runs), strips every pika record's traceback
before the root logger's handlers see it: the pika half of that check could no longer fail. The
check now also reads pika's records on the ``pika`` logger itself, ahead of ``PikaAddresses``
(the ``pika_tracebacks`` fixture)."""

from __future__ import annotations

import logging

import pytest

from tests.unit.test_bulk import assert_no_traceback


def test_the_bulk_tests_see_a_traceback_pika_logs(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], pika_tracebacks: list[str]
) -> None:
    caplog.set_level(logging.WARNING)
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except ConnectionRefusedError:
        logging.getLogger("pika.adapters.utils.connection_workflow").error("Connection failed", exc_info=True)
    assert [r.exc_info for r in caplog.records] == [None]  # stripped before caplog saw it
    assert pika_tracebacks == ["pika.adapters.utils.connection_workflow: Connection failed"]
    with pytest.raises(AssertionError):
        assert_no_traceback(caplog, capfd, pika_tracebacks)  # a traceback pika logged must fail the check
