"""What the command-line programs print is plain and true (review 5): help texts without reST
markup, a count with its number's grammar, a misconfigured state store not called unreachable."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from jobctl.main import main as jobctl
from jobsystem.ops.outages import unreachable
from jobsystem.store.base import StoreMisconfigured, StoreUnavailable


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, command in group.commands.items():
        found.append((*path, name))
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
    return found


@pytest.mark.parametrize("command", _commands(jobctl), ids=" ".join)
def test_a_help_text_shows_no_rst_markup(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(jobctl, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "``" not in result.output, result.output


def test_a_misconfigured_store_is_said_misconfigured_not_unreachable() -> None:
    said = unreachable("state store", StoreMisconfigured("DB index is out of range"))
    assert said == "state store misconfigured (StoreMisconfigured)"
    said = unreachable("state store", StoreUnavailable("refused"))
    assert said == "state store unreachable (StoreUnavailable)"


def test_the_scheduler_check_counts_one_schedule_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scheduler.__main__ import main as scheduler

    path = tmp_path / "schedules.toml"
    path.write_text('[[schedule]]\nid = "purge"\nactor = "purge_exports"\nevery = "15m"\n')
    assert scheduler(["--check", "--schedules", str(path)]) == 0
    assert f"{path}: 1 schedule, valid" in capsys.readouterr().out
