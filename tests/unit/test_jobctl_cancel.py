"""`jobctl cancel` says what its marks will change: a job that already finished, or an id with
no status record, is marked all the same (a mark on a job not recorded yet still stops it when it
arrives), but the command must not read as if it had stopped them."""

from __future__ import annotations

from types import SimpleNamespace

from click.testing import CliRunner

import jobctl.main as cli
import jobsystem.workflows
import middleware.status
from jobsystem.store.status_records import JobStatus


def test_jobctl_cancel_names_the_jobs_already_finished_and_the_ids_it_has_no_record_of(monkeypatch):
    records = {
        "m-running": JobStatus(message_id="m-running", state="running", actor="ship"),
        "m-done": JobStatus(message_id="m-done", state="succeeded", actor="ship"),
    }
    backend = SimpleNamespace(get_many=lambda ids: {i: records[i] for i in ids if i in records})
    monkeypatch.setattr(cli, "load_system", lambda: SimpleNamespace(broker=object()))
    monkeypatch.setattr(middleware.status, "find_status", lambda broker: SimpleNamespace(backend=backend))
    monkeypatch.setattr(jobsystem.workflows, "cancel", lambda *ids, broker: list(ids))
    shown = CliRunner().invoke(cli.main, ["cancel", "m-running", "m-done", "m-typo"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == "cancelled 3 job(s)"
    assert lines[1] == "  already finished, nothing to stop: m-done (succeeded)"
    assert lines[2].startswith("  no status record") and lines[2].endswith(": m-typo")
    assert len(lines) == 3  # the running job is stopped: nothing to say about it


def test_jobctl_cancel_without_job_status_says_only_what_it_marked(monkeypatch):
    monkeypatch.setattr(cli, "load_system", lambda: SimpleNamespace(broker=object()))
    monkeypatch.setattr(middleware.status, "find_status", lambda broker: None)
    monkeypatch.setattr(jobsystem.workflows, "cancel", lambda *ids, broker: list(ids))
    shown = CliRunner().invoke(cli.main, ["cancel", "m-1"])
    assert (shown.exit_code, shown.output) == (0, "cancelled 1 job(s)\n")


def test_jobctl_status_and_cancel_name_an_unreachable_store_by_its_error_class_only(
    monkeypatch, logging_restored
):
    """The store's error text names its host and port (and may quote a URL): never on stdout/stderr
    (at jobctl's default LOG_LEVEL; its DEBUG line goes through the scrubbing log)."""
    import logging

    import structlog

    from jobsystem.store.base import StoreUnavailable

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))

    def unreachable(*args, **kwargs):
        raise StoreUnavailable("Error 111 connecting to 10.20.30.40:6390 (redis://:s3cret-token@db)")

    monkeypatch.setattr(cli, "load_system", lambda: SimpleNamespace(broker=object(), store=object()))
    monkeypatch.setattr(middleware.status, "find_status", lambda broker: None)
    monkeypatch.setattr(jobsystem.workflows, "cancel", unreachable)
    monkeypatch.setattr("jobsystem.ops.status.get_status", unreachable)
    for command in (["cancel", "m-1"], ["status", "m-1"]):
        shown = CliRunner().invoke(cli.main, command)
        assert shown.exit_code == 2, shown.output
        assert shown.output == "jobctl: state store unreachable (StoreUnavailable)\n"
