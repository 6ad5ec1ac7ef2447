"""Settings: validated once, errors name the variable and never echo a password."""

from __future__ import annotations

import pytest

from jobsystem.settings import SettingsError, load_settings
from jobsystem.urls import redact_url


def test_defaults_are_valid():
    settings = load_settings({})
    assert settings.rabbitmq_url == "amqp://guest:guest@127.0.0.1:5672/%2F"
    assert settings.rabbitmq_vhost == "/"
    assert settings.management_url == "http://127.0.0.1:15672"
    assert settings.management_auth == ("guest", "guest")
    assert settings.job_time_limit_ms < settings.rabbitmq_consumer_timeout_ms
    assert settings.delay_horizon_ms * 2 <= settings.rabbitmq_consumer_timeout_ms


def test_management_credentials_come_from_the_amqp_url_unless_given_and_never_ride_in_its_urls():
    """The credentials go in ``management_auth`` (decoded), never in a URL: HTTP clients quote a
    request's URL in their error texts."""
    settings = load_settings({"RABBITMQ_URL": "amqp://app:s%40cret@mq:5672/prod"})
    assert settings.management_url == "http://127.0.0.1:15672"
    assert settings.management_auth == ("app", "s@cret")
    assert settings.rabbitmq_vhost == "prod"
    own = load_settings({"RABBITMQ_MANAGEMENT_URL": "https://ops:p%23w@mq:15671/"})
    assert own.management_url == "https://mq:15671"
    assert own.management_auth == ("ops", "p#w")
    assert "p%23w" not in own.queues_api("q", "get") and "ops" not in own.management_api("overview")


def test_management_api_urls_keep_the_base_path_and_encode_each_segment():
    """Behind a reverse proxy the API lives under a path (RabbitMQ's ``path_prefix``): kept, with
    or without a trailing slash; a ``/`` in a vhost or queue name is encoded, not a path step."""
    for base in ("http://mq:15672/rabbitmq", "http://mq:15672/rabbitmq/"):
        settings = load_settings({"RABBITMQ_MANAGEMENT_URL": base, "RABBITMQ_URL": "amqp://u:p@mq/a%2Fb"})
        assert settings.management_api("overview") == "http://mq:15672/rabbitmq/api/overview"
        assert settings.queues_api("q/1", "get") == "http://mq:15672/rabbitmq/api/queues/a%2Fb/q%2F1/get"
    assert load_settings({}).queues_api() == "http://127.0.0.1:15672/api/queues/%2F"


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"RABBITMQ_URL": "http://user:hunter2@mq/"}, "RABBITMQ_URL"),
        ({"RABBITMQ_URL": "amqp://user:hunter2@mq:notaport/"}, "RABBITMQ_URL"),
        ({"STATE_URL": "postgres://user:hunter2@db/x"}, "STATE_URL"),
        ({"SMTP_URL": "smtp://user:hunter2@"}, "SMTP_URL"),
        ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
        ({"WORKER_THREADS": "0"}, "WORKER_THREADS"),
        ({"JOB_MAX_RETRIES": "many"}, "JOB_MAX_RETRIES"),
        ({"DELAY_HORIZON_MS": "1000"}, "DELAY_HORIZON_MS"),
        (
            {
                "RABBITMQ_CONSUMER_TIMEOUT_MS": "60000",
                "JOB_TIME_LIMIT_MS": "59000",
                "DELAY_HORIZON_MS": "31000",
            },
            "DELAY_HORIZON_MS",
        ),
        ({"JOB_MIN_BACKOFF_MS": "900000", "JOB_MAX_BACKOFF_MS": "1000"}, "JOB_MIN_BACKOFF_MS"),
        ({"SENTRY_DSN": "not a dsn hunter2"}, "SENTRY_DSN"),
        # Parsed by the check, refused by sentry_sdk.init at build time (a traceback before):
        ({"SENTRY_DSN": "https://hunter2@o0.ingest.sentry.io/notanumber"}, "SENTRY_DSN"),
        ({"SENTRY_DSN": "https://hunter2@o0.ingest.sentry.io:99999/1"}, "SENTRY_DSN"),
        # A password with an unencoded '?': read as a port and a query (or a host), shown in part.
        ({"SMTP_URL": "smtp://u:12?hunter2@h"}, "SMTP_URL"),
        ({"RABBITMQ_URL": "amqp://user:1234?hunter2@host/%2F"}, "RABBITMQ_URL"),
        ({"STATE_URL": "redis://u:12?hunter2@h/0"}, "STATE_URL"),
        ({"RABBITMQ_URL": "amqp://u:p@h/%2F?hunter2=1"}, "RABBITMQ_URL"),
        ({"QUEUE_PREFIX": "a b"}, "QUEUE_PREFIX"),
        # The API's paths go after the URL: a query string or fragment would swallow them.
        ({"RABBITMQ_MANAGEMENT_URL": "http://mq:15672/?hunter2=1"}, "RABBITMQ_MANAGEMENT_URL"),
        ({"RABBITMQ_MANAGEMENT_URL": "http://mq:15672#hunter2"}, "RABBITMQ_MANAGEMENT_URL"),
        ({"RABBITMQ_MANAGEMENT_URL": "http://mq:15672/hunter2?"}, "RABBITMQ_MANAGEMENT_URL"),
        ({"PII_HASH_KEY": "hunter2"}, "PII_HASH_KEY"),
        ({"PII_EXTRA_KEYS": "loyalty_id, hunter2 pw"}, "PII_EXTRA_KEYS"),
    ],
)
def test_bad_value_names_the_variable_without_its_value(environ, variable):
    with pytest.raises(SettingsError) as caught:
        load_settings(environ)
    assert variable in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(SettingsError) as caught:
        load_settings({"WORKER_THREADS": "-1", "LOG_LEVEL": "LOUD"})
    assert "WORKER_THREADS" in str(caught.value) and "LOG_LEVEL" in str(caught.value)


def test_pii_settings_are_parsed_and_the_hash_key_is_never_shown():
    settings = load_settings(
        {"PII_HASH_KEY": "hunter2-hunter2-hunter2", "PII_EXTRA_KEYS": " loyalty_id,Customer-Ref ,"}
    )
    assert settings.pii_extra_keys == ("loyalty_id", "Customer-Ref")
    assert "hunter2" not in repr(settings)
    assert (
        settings.pii_hash_key is not None
        and settings.pii_hash_key.get_secret_value() == "hunter2-hunter2-hunter2"
    )


def test_empty_variable_counts_as_unset():
    assert load_settings({"SENTRY_DSN": "", "JOB_MAX_AGE_MS": ""}).sentry_dsn is None


def test_redact_url_hides_only_the_password():
    assert redact_url("amqp://app:hunter2@mq:5672/v") == "amqp://app:***@mq:5672/v"
    assert redact_url("amqp://mq/v") == "amqp://mq/v"


def test_cluster_urls_each_get_timeouts():
    from jobsystem.rabbitmq.broker import connection_urls

    settings = load_settings({"RABBITMQ_URL": "amqp://u:p@a:5672/%2F;amqp://u:p@b:5672/%2F?heartbeat=5"})
    urls = connection_urls(settings)
    assert len(urls) == 2
    assert "heartbeat=60" in urls[0] and "blocked_connection_timeout=300" in urls[0]
    assert "heartbeat=5" in urls[1] and "heartbeat=60" not in urls[1]
    assert redact_url(settings.rabbitmq_url) == "amqp://u:***@a:5672/%2F;amqp://u:***@b:5672/%2F?heartbeat=5"


def test_waits_longer_than_the_consumer_timeout_are_accepted():
    """Delays past the horizon wait in RabbitMQ, not in a worker: backoffs and rate-limit
    reservations may be hours or days, whatever RabbitMQ's consumer_timeout."""
    settings = load_settings(
        {
            "RABBITMQ_CONSUMER_TIMEOUT_MS": "60000",
            "JOB_TIME_LIMIT_MS": "50000",
            "JOB_MAX_BACKOFF_MS": str(3 * 86_400_000),
            "RATE_LIMIT_MAX_DELAY_MS": str(86_400_000),
        }
    )
    assert settings.job_max_backoff_ms == 3 * 86_400_000
    assert settings.delay_horizon_ms == 30_000


def test_the_time_limit_and_the_longest_token_wait_must_stay_below_the_consumer_timeout():
    # The time limit starts once the token came: a worker may have slept RATE_LIMIT_WAIT_MS first.
    limits = {"RABBITMQ_CONSUMER_TIMEOUT_MS": "60000", "JOB_TIME_LIMIT_MS": "50000"}
    assert load_settings({**limits, "RATE_LIMIT_WAIT_MS": "9999"}).job_time_limit_ms == 50_000
    with pytest.raises(SettingsError, match="JOB_TIME_LIMIT_MS: plus RATE_LIMIT_WAIT_MS"):
        load_settings({**limits, "RATE_LIMIT_WAIT_MS": "10000"})


def test_the_time_limit_must_still_stay_below_the_consumer_timeout():
    with pytest.raises(SettingsError) as caught:
        load_settings({"RABBITMQ_CONSUMER_TIMEOUT_MS": "60000"})  # the default time limit is 10 min
    assert caught.value.problems == [
        "JOB_TIME_LIMIT_MS: plus RATE_LIMIT_WAIT_MS, must be below RABBITMQ_CONSUMER_TIMEOUT_MS "
        "(RabbitMQ redelivers a job still running past it)"
    ]


@pytest.mark.parametrize(
    "url",
    [
        "smtp://mailer:hunter2@relay:587",
        "smtp://mailer:hunter2@relay:587?starttls=0",
        "smtp://mailer@relay:25",
        "smtp://:hunter2@relay",
    ],
)
def test_smtp_credentials_without_tls_are_refused_saying_how_to_fix_it(url):
    # login() would send them in plain text.
    with pytest.raises(SettingsError) as caught:
        load_settings({"SMTP_URL": url})
    (problem,) = caught.value.problems
    assert problem.startswith("SMTP_URL: ") and "?starttls=1" in problem and "smtps://" in problem
    assert "hunter2" not in str(caught.value) and "mailer" not in str(caught.value)


@pytest.mark.parametrize(
    "url", ["smtp://mailer:pw@relay:587?starttls=1", "smtps://mailer:pw@relay", "smtp://relay:25"]
)
def test_smtp_urls_with_tls_or_without_credentials_pass(url):
    assert load_settings({"SMTP_URL": url}).smtp_url == url


def test_a_viewer_password_equal_to_the_admins_is_refused_without_showing_it():
    """The read-only viewer would know the admin's password and could log in as admin."""
    same = "correct-horse-battery"
    with pytest.raises(SettingsError) as caught:
        load_settings({"DASHBOARD_ADMIN_PASSWORD": same, "DASHBOARD_VIEWER_PASSWORD": same})
    assert caught.value.problems == [
        "DASHBOARD_VIEWER_PASSWORD: must differ from DASHBOARD_ADMIN_PASSWORD "
        "(the read-only viewer could log in as admin)"
    ]
    assert same not in str(caught.value)
    other = load_settings({"DASHBOARD_ADMIN_PASSWORD": same, "DASHBOARD_VIEWER_PASSWORD": same + "-v"})
    assert other.dashboard_viewer_password is not None
