"""Start-up checks of what the reference email actor needs of the settings (found by review 3).

- ``MAIL_FROM`` is one bare address, as each recipient of ``send_email`` must be: any text used to
  pass start-up (the relay then refused each mail, retried to the dead letters, or took it with a
  broken sender), and one with a line break dead-lettered every mail job at once as "a header
  holds a line break", a message that pointed at the job's data, not at the setting.
- Valid settings could make the SMTP timeout negative: ``smtp_operation_timeout`` takes 10 s from
  the email actor's time limit, which ``longest_time_limit_ms`` may make shorter than that.
"""

from __future__ import annotations

import pytest

from jobsystem.mail_address import is_address
from jobsystem.settings import SMTP_ROUND_TRIPS, SettingsError, load_settings


@pytest.mark.parametrize(
    "value",
    [
        "jobs at example dot com",
        "jobs@example.com\nBcc: all@example.com",
        "jobs@example.com\n",  # a trailing line break: ``$`` of a ``match`` let it through
        "Jobs <jobs@example.com>",
    ],
)
def test_a_mail_from_that_is_no_address_stops_start_up_naming_the_variable(value: str) -> None:
    """README, *Settings*: "Every setting is an environment variable, validated once at start-up:
    a bad value stops the process ... with one line per bad variable, its name and what is wrong,
    never its value." The sender is checked as the email actor checks each recipient."""
    with pytest.raises(SettingsError) as raised:
        load_settings({"MAIL_FROM": value})
    (problem,) = raised.value.problems
    assert problem.startswith("MAIL_FROM: ")
    assert value.splitlines()[0] not in problem and "Bcc" not in problem  # never its value


def test_a_plain_mail_from_starts() -> None:
    assert load_settings({"MAIL_FROM": "shop@mail.example.org"}).mail_from == "shop@mail.example.org"
    assert load_settings({}).mail_from == "jobs@example.com"


@pytest.mark.parametrize("text", ["ana@example.com\n", "ana@example.com\r\n", " ana@example.com"])
def test_an_address_is_the_whole_text(text: str) -> None:
    assert is_address(text.strip()) and not is_address(text)


def test_valid_settings_never_give_the_email_actor_a_negative_smtp_timeout() -> None:
    """Each value in range and the other cross-checks passed (the time limit plus the rate-limit
    wait below the consumer timeout, the horizon at most half of it): the email actor's time limit
    was capped to 90 % of what the consumer timeout leaves after the rate-limit wait, 9 s, and
    ``smtp_operation_timeout`` was (9 s - 10 s) / 15; ``smtplib`` then raised ValueError for the
    socket's timeout on every mail (retried, then dead-lettered). Start-up refuses it now."""
    environ = {
        "RABBITMQ_CONSUMER_TIMEOUT_MS": "60000",
        "RATE_LIMIT_WAIT_MS": "50000",
        "JOB_TIME_LIMIT_MS": "5000",
    }
    with pytest.raises(SettingsError) as raised:
        load_settings(environ)
    (problem,) = raised.value.problems
    assert problem.startswith("RABBITMQ_CONSUMER_TIMEOUT_MS: minus RATE_LIMIT_WAIT_MS")


@pytest.mark.parametrize(("wait_ms", "starts"), [(32_222, True), (32_223, False)])
def test_the_consumer_timeout_leaves_each_smtp_round_trip_a_second(wait_ms: int, starts: bool) -> None:
    """The least room that starts: 10 s and a second per round trip in 90 % of what is left."""
    environ = {
        "RABBITMQ_CONSUMER_TIMEOUT_MS": "60000",
        "RATE_LIMIT_WAIT_MS": str(wait_ms),
        "JOB_TIME_LIMIT_MS": "5000",
    }
    if not starts:
        with pytest.raises(SettingsError, match="at least 27778 ms"):
            load_settings(environ)
        return
    settings = load_settings(environ)
    assert settings.smtp_operation_timeout >= 1
    assert SMTP_ROUND_TRIPS * settings.smtp_operation_timeout * 1000 + 10_000 <= settings.smtp_time_limit_ms
