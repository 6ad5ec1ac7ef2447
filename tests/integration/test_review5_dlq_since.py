"""Review 5 (a new user's ``jobctl dlq list --since yesterday``): every other bad option of
``jobctl`` is named in click's usual line (``Error: Invalid value for '--timeout': ...``), but a
bad ``--since`` of ``dlq list``/``show``/``retry``/``purge``/``export`` says ``Error: Invalid
value: use an ISO date or time, ...`` without naming the option: on a command line with
``--queue``, ``--actor``, ``--exception`` and ``--since`` the user is left to guess which one."""

from __future__ import annotations

import pytest

from tests.jobctl_run import jobctl


@pytest.mark.parametrize("command", [["list"], ["export"], ["purge", "--all", "--yes"]])
def test_a_bad_since_is_refused_naming_the_option(prefix: str, command: list[str]) -> None:
    run = jobctl(prefix, "dlq", *command, "--since", "yesterday", check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "use an ISO date or time" in run.stderr  # the refusal itself is there
    assert "'--since'" in run.stderr, run.stderr
