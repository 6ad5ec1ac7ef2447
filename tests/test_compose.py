"""compose.yaml and the Dockerfile, checked without a Docker engine: services, commands and
environment must agree with the settings and the console scripts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from actors.settings import Settings, load_settings
from jobctl.main import main as jobctl
from tests.support import ROOT

COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def _environment(service: str) -> dict[str, str]:
    # Resolve ${VAR:-default} the way compose does when VAR is unset.
    env = SERVICES[service]["environment"]
    return {k: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(v)) for k, v in env.items()}


def test_services_are_all_there():
    assert set(SERVICES) >= {"rabbitmq", "redis", "worker", "scheduler", "mailpit"}


@pytest.mark.parametrize("service", ["worker", "scheduler"])
def test_app_environment_is_valid_settings(service):
    env = _environment(service)
    known = {name.upper() for name in Settings.model_fields}
    assert set(env) <= known, set(env) - known
    settings = load_settings(env)
    assert urlsplit(settings.state_url).scheme == "redis"
    assert urlsplit(settings.smtp_url).hostname == "mailpit"
    assert urlsplit(settings.rabbitmq_url).hostname == "rabbitmq"


def test_rabbitmq_uses_a_real_user_and_the_declared_consumer_timeout():
    rabbit = SERVICES["rabbitmq"]
    assert "management" in rabbit["image"]
    assert "15672:15672" in rabbit["ports"]
    user, password = (
        rabbit["environment"]["RABBITMQ_DEFAULT_USER"],
        rabbit["environment"]["RABBITMQ_DEFAULT_PASS"],
    )
    assert user != "guest"
    url = urlsplit(_environment("worker")["RABBITMQ_URL"])
    assert (url.username, url.password) == (user, password)
    conf = COMPOSE["configs"][rabbit["configs"][0]["source"]]["content"]
    timeout = int(re.search(r"^consumer_timeout\s*=\s*(\d+)", conf, re.M).group(1))
    settings = load_settings(_environment("worker"))
    assert timeout == settings.rabbitmq_consumer_timeout_ms
    assert settings.job_max_backoff_ms < timeout and settings.job_time_limit_ms < timeout


def test_redis_keeps_an_append_only_file():
    command = SERVICES["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in SERVICES["redis"]["volumes"])


def test_worker_command_is_a_real_jobctl_command_with_a_grace_period_for_shutdown():
    command = SERVICES["worker"]["command"]
    assert command[0] == "jobctl" and command[1] in jobctl.commands
    grace = SERVICES["worker"]["stop_grace_period"]
    minutes = int(grace.removesuffix("m"))
    assert minutes * 60_000 >= load_settings(_environment("worker")).worker_shutdown_timeout_ms


def test_scheduler_command_runs_the_scheduler_module():
    assert SERVICES["scheduler"]["command"] == ["python", "-m", "scheduler"]
    assert (ROOT / "scheduler" / "__main__.py").is_file()


def test_dockerfile_copies_every_package_and_installs_the_console_scripts():
    dockerfile = (ROOT / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    for package in packages:
        assert f"COPY {package} ./{package}" in dockerfile
        assert Path(ROOT / package / "__init__.py").is_file()
    assert "pip install" in dockerfile and "USER " in dockerfile
    assert project["project"]["scripts"]["jobctl"] == "jobctl.main:main"
