"""Bad settings, schedules and command-line input: one clear line naming the variable, schedule
field or option, exit code 2, no traceback, and never a secret value, from every entry point."""

from __future__ import annotations

from datetime import UTC, datetime

import pika
import pytest
from click.testing import CliRunner

import actors  # noqa: F401 - the project's actors, which schedules name
from jobctl.main import main as jobctl
from jobctl.worker_argv import dramatiq_argv
from jobsystem.limits import RateLimitConfigError
from jobsystem.rabbitmq.broker import connection_urls
from jobsystem.settings import SettingsError, load_settings
from jobsystem.startup import configuration_checked
from jobsystem.system import get_system
from scheduler.schedules import ScheduleError, load_schedules
from scheduler.triggers import _RECURRENCE, CronSchedule, _fires_before, next_fires

SECRET = "hunter2"


AMQP = f"amqp://app:{SECRET}@127.0.0.1:5672/%2F"


REDIS = f"redis://app:{SECRET}@127.0.0.1:6379"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("STATE_URL", f"{REDIS}/abc"),  # redis-py would silently use db 0
        ("STATE_URL", f"{REDIS}/?db=abc"),
        ("STATE_URL", f"{REDIS}/?db=-1"),
        ("STATE_URL", f"{REDIS}/1?db=2"),
        ("STATE_URL", f"{REDIS}/0?socket_timeout=nan"),
        ("STATE_URL", f"{REDIS}/0?no_such_option=1"),
        ("STATE_URL", "sqlite://host/state.db"),
        ("STATE_URL", "sqlite:///state.db?mode=ro"),
        ("RABBITMQ_URL", f"{AMQP}?heartbeat=abc"),
        ("RABBITMQ_URL", f"{AMQP}?heartbeat=-1"),
        ("RABBITMQ_URL", f"{AMQP}?blocked_connection_timeout=nan"),
        ("RABBITMQ_URL", f"{AMQP}?blocked_connection_timeout=0"),
        ("RABBITMQ_URL", f"{AMQP}?connection_attempts=0"),
        ("RABBITMQ_URL", f"{AMQP}?retry_delay=inf"),
        ("RABBITMQ_URL", f"{AMQP}?socket_timeout=1e400"),
        ("RABBITMQ_URL", f"{AMQP}?frame_max=1"),
        ("RABBITMQ_URL", f"{AMQP}?heartbeat=5&heartbeat=6"),
        ("RABBITMQ_URL", f"{AMQP}?hearbeat=5"),
        ("RABBITMQ_URL", f"{AMQP};{AMQP}?retry_delay=nan"),  # the second node of a cluster
        ("RABBITMQ_URL", f"amqp://app:{SECRET}@mq/prod/eu"),  # pika would use vhost "prod"
        ("SMTP_URL", f"smtp://app:{SECRET}@mail:25?starttls=ture"),
        ("SMTP_URL", f"smtps://app:{SECRET}@mail?starttls=1"),
        ("SMTP_URL", f"smtp://app:{SECRET}@mail?tls=1"),
        ("SMTP_TIMEOUT", "1e300"),
        ("JOB_TIME_LIMIT_MS", "1800000"),  # the default RABBITMQ_CONSUMER_TIMEOUT_MS
        ("WORKER_SHUTDOWN_TIMEOUT_MS", "99999999999999999999999"),
        ("IDEMPOTENCY_LEASE_MS", str(10**16)),
        ("DEAD_LETTER_TTL_MS", "315360000001"),  # past RabbitMQ's own limit for x-message-ttl
        ("DEAD_LETTER_MAX_LENGTH", str(2**64)),
        ("RABBITMQ_BLOCKED_CONNECTION_TIMEOUT", "10000000000"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(variable, value):
    with pytest.raises(SettingsError) as caught:
        load_settings({variable: value})
    (problem,) = caught.value.problems
    assert problem.startswith(f"{variable}: ") and "\n" not in problem
    assert SECRET not in str(caught.value) and SECRET not in caught.value.report("x")
    assert caught.value.report("jobctl") == f"jobctl: invalid setting {problem}\n"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "infinity"])
@pytest.mark.parametrize("variable", ["SMTP_TIMEOUT", "STATE_TIMEOUT"])
def test_a_number_that_is_not_finite_is_refused_as_such(variable, value):
    # nan compares false with every bound: without the check it would pass them.
    with pytest.raises(SettingsError) as caught:
        load_settings({variable: value})
    assert caught.value.problems == [f"{variable}: Input should be a finite number"]


def test_url_parameters_the_clients_accept_pass_and_reach_the_broker():
    query = (
        "heartbeat=30&blocked_connection_timeout=5.5&connection_attempts=2&retry_delay=0.5&socket_timeout=3"
    )
    settings = load_settings(
        {
            "RABBITMQ_URL": f"{AMQP}?{query}",
            "STATE_URL": f"rediss://app:{SECRET}@redis:6380/15?ssl_cert_reqs=none&health_check_interval=10",
            "SMTP_URL": "smtp://mail:587?starttls=yes",
        }
    )
    (url,) = connection_urls(settings)
    parameters = pika.URLParameters(url)
    assert (parameters.heartbeat, parameters.blocked_connection_timeout) == (30, 5.5)
    assert (parameters.connection_attempts, parameters.retry_delay, parameters.socket_timeout) == (2, 0.5, 3)
    assert load_settings({"STATE_URL": f"{REDIS}/"}).state_url.endswith("/")  # no db: 0


def test_cross_field_problems_are_one_line_each():
    with pytest.raises(SettingsError) as caught:
        load_settings(
            {
                "RABBITMQ_CONSUMER_TIMEOUT_MS": "600000",
                "DELAY_HORIZON_MS": "300001",
                "RATE_LIMIT_MAX_DELAY_MS": "1000",
            }
        )
    lines = caught.value.report("scheduler").splitlines()
    assert [line.split(":")[1].split()[-1] for line in lines] == [
        "JOB_TIME_LIMIT_MS",
        "DELAY_HORIZON_MS",
        "RATE_LIMIT_WAIT_MS",
    ]


def test_an_actor_naming_a_service_rate_limits_lacks_becomes_a_settings_error():
    with pytest.raises(SettingsError) as caught, configuration_checked():
        raise RateLimitConfigError(
            "actor 'send_email': rate_limit service 'smtp' is not configured in RATE_LIMITS"
        )
    (problem,) = caught.value.problems
    assert problem.startswith("RATE_LIMITS: actor 'send_email'")


def test_jobctl_worker_keeps_options_after_the_modules():
    settings = load_settings({"WORKER_PROCESSES": "3"})
    argv = dramatiq_argv("dramatiq", settings, ("myapp.jobs", "-Q", "emails", "reports", "--processes", "1"))
    assert argv[:3] == ["dramatiq", "actors", "myapp.jobs"]
    assert argv[3:5] == ["--processes", "3"] and argv[-5:] == ["-Q", "emails", "reports", "--processes", "1"]


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "1e9", "soon"])
@pytest.mark.parametrize("command", ["ping", "health"])
def test_a_timeout_must_be_a_finite_number_of_seconds(command, timeout):
    result = CliRunner().invoke(jobctl, [command, "--timeout", timeout])
    assert result.exit_code == 2 and "--timeout" in result.output
    assert "Traceback" not in result.output


def test_dlq_retry_batch_size_must_be_positive():
    result = CliRunner().invoke(jobctl, ["dlq", "retry", "--all", "--batch-size", "0"])
    assert result.exit_code == 2 and "--batch-size" in result.output


def schedule_problems(tmp_path, entry: str) -> list[str]:
    path = tmp_path / "schedules.toml"
    path.write_text(f'[[schedule]]\nid = "s1"\nactor = "purge_exports"\n{entry}\n')
    with pytest.raises(ScheduleError) as caught:
        load_schedules(path, get_system().broker.actors)
    return caught.value.problems


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ('every = "1h"\nmisfire_grace = 0', "misfire_grace must be longer than zero"),
        ('every = "1h"\nmisfire_grace = -5', "misfire_grace must be longer than zero"),
        ('every = "1h"\nmisfire_grace = "0s"', "misfire_grace must be longer than zero"),
        ('every = "1h"\nmisfire_grace = 99999999999999999999', "misfire_grace must be at most 3650d"),
        ('every = "99999999999d"', "every must be at most 3650d"),
        ('every = "3651d"', "every must be at most 3650d"),
        ('cron = "0 0 30 2 *"', "never fires"),
        ('cron = "0 12 31 4,6,9,11 *"', "never fires"),
    ],
)
def test_a_schedule_that_would_never_fire_or_overflow_is_refused(tmp_path, entry, expected):
    (problem,) = schedule_problems(tmp_path, entry)
    assert problem.startswith("schedule 's1': ") and expected in problem


def test_a_cron_with_an_impossible_date_and_a_weekday_fires_on_the_weekday():
    # crontab: either day field matching is enough; the impossible date alone is dropped.
    fires = list(next_fires(CronSchedule("0 0 30 2 1"), datetime(2026, 1, 1, tzinfo=UTC), 3))
    assert len(fires) == 3 and {(f.month, f.weekday()) for f in fires} == {(2, 0)}


def test_a_date_that_comes_round_only_every_eight_years_is_not_taken_for_one_that_never_does():
    # The "never fires" check stops its search after _RECURRENCE (a dozen years of search took a
    # second per expression); 29 February skips 2100, the longest wait there is.
    from apscheduler.triggers.cron import CronTrigger

    leap_day = CronTrigger(minute="0", hour="0", day="29", month="2", timezone=UTC)
    after_2096 = datetime(2096, 3, 1, tzinfo=UTC)
    assert _fires_before(leap_day, after_2096, after_2096 + _RECURRENCE)
    assert not _fires_before(leap_day, after_2096, datetime(2104, 2, 28, tzinfo=UTC))
    assert leap_day.end_date is None  # the schedule's own trigger is left unbounded
    assert next(next_fires(CronSchedule("0 0 29 2 *"), after_2096, 1)) == datetime(2104, 2, 29, tzinfo=UTC)


def test_a_schedules_file_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[[schedule]]\nid = "café"\n'.encode("latin-1"))
    with pytest.raises(ScheduleError, match="not UTF-8 text"):
        load_schedules(path, get_system().broker.actors)
