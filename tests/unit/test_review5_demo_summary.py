"""Review 5 (a new user's ``make demo``): the summary ends with commands to "look closer", among
them ``jobctl status <the id of one of the demo's media jobs>``, printed just under the line that
says the demo deleted every state key under its prefix (its job status records included) and
under a prefix the operator's shell does not have. Pasted, it can only answer ``unknown`` (exit
1): the one concrete command the demo hands a new user fails, whatever QUEUE_PREFIX is added."""

from __future__ import annotations

import io

from rich.console import Console

from demo.main import _print_summary

_DELETED_JOB = "b0e96fb5-fc4d-4f4e-975e-39239d6364ca"


def _summary() -> dict[str, object]:
    return {
        "sent": 310,
        "run": 320,
        "run_per_queue": {"emails": 304, "media": 3},
        "mails_sent": 303,
        "mails_delivered": 303,
        "deduplicated": 52,
        "rate_limited_waits": 560,
        "dead_lettered": 3,
        "replayed": 3,
        "partner_syncs_ok": 3,
        "scheduler_health_checks": 8,
        "message_ids": {"media": [_DELETED_JOB]},
    }


def test_the_summary_suggests_no_status_lookup_of_a_job_it_deleted() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    cleaned = {"queues_deleted": ["q"] * 45, "exchanges_deleted": ["x"] * 31, "state_keys_deleted": 673}
    _print_summary(console, _summary(), cleaned, "demo-694d70-")
    text = out.getvalue()
    assert "673 state keys under 'demo-694d70-'" in text  # the records are gone...
    assert f"jobctl status {_DELETED_JOB}" not in text  # ...so no command should look one up
