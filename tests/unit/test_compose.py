"""compose.yaml and the Dockerfile, checked without a Docker engine: services, commands and
environment must agree with the settings and the console scripts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from jobctl.main import main as jobctl
from jobsystem.settings import Settings, load_settings
from tests.support import ROOT

COMPOSE_TEXT = (ROOT / "compose.yaml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES = COMPOSE["services"]
#: What a user puts in .env for the required variables (random values of their own).
DOTENV = {
    "RABBITMQ_PASSWORD": "rabbit-Pa55-x9",
    "REDIS_PASSWORD": "redis-Pa55-x9",
    "STATE_KEY_SECRET": "s" * 24,
}


def _resolve(value: str) -> str:
    """``${VAR:-default}`` and ``${VAR:?error}`` as compose resolves them with DOTENV as .env."""
    value = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: DOTENV.get(m[1], m[2]), value)
    return re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: DOTENV[m[1]], value)


def _environment(service: str) -> dict[str, str]:
    env = SERVICES[service]["environment"]
    return {k: _resolve(str(v)) for k, v in env.items()}


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
    assert "127.0.0.1:15672:15672" in rabbit["ports"]
    user, password = (
        _environment("rabbitmq")["RABBITMQ_DEFAULT_USER"],
        _environment("rabbitmq")["RABBITMQ_DEFAULT_PASS"],
    )
    assert user != "guest"
    url = urlsplit(_environment("worker")["RABBITMQ_URL"])
    assert (url.username, url.password) == (user, password)
    conf = COMPOSE["configs"][rabbit["configs"][0]["source"]]["content"]
    found = re.search(r"^consumer_timeout\s*=\s*(\d+)", conf, re.M)
    assert found is not None, conf
    timeout = int(found.group(1))
    settings = load_settings(_environment("worker"))
    assert timeout == settings.rabbitmq_consumer_timeout_ms
    assert settings.job_max_backoff_ms < timeout and settings.job_time_limit_ms < timeout


def test_every_published_port_listens_on_loopback_only():
    published = [(name, port) for name, service in SERVICES.items() for port in service.get("ports", [])]
    assert published and all(str(port).startswith("127.0.0.1:") for _, port in published), published


def test_passwords_come_from_dotenv_and_have_no_default():
    used = set(re.findall(r"\$\{(\w+)", COMPOSE_TEXT))
    documented = set(re.findall(r"^(\w+)=", (ROOT / ".env.example").read_text(), re.M))
    assert used <= documented, used - documented
    for name in ("RABBITMQ_PASSWORD", "REDIS_PASSWORD", "STATE_KEY_SECRET"):
        assert re.search(rf"\$\{{{name}:\?", COMPOSE_TEXT) and not re.search(rf"\$\{{{name}:-", COMPOSE_TEXT)
    assert "jobs-secret" not in COMPOSE_TEXT
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    # Redis asks for the password the workers connect with.
    command = SERVICES["redis"]["command"]
    assert _resolve(command[command.index("--requirepass") + 1]) == DOTENV["REDIS_PASSWORD"]
    assert urlsplit(_environment("worker")["STATE_URL"]).password == DOTENV["REDIS_PASSWORD"]


def test_make_up_refuses_to_start_without_dotenv(tmp_path):
    import shutil
    import subprocess

    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    result = subprocess.run(["make", "up"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and ".env.example" in result.stderr


def test_redis_keeps_an_append_only_file():
    command = SERVICES["redis"]["command"]
    assert str(command[command.index("--appendonly") + 1]) == "yes"
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
