"""``python -m demo --short`` against the real services: its figures match what happened, and it
leaves no queue or state key behind, also when interrupted."""

from __future__ import annotations

from tests.support import ROOT


def test_the_production_guide_names_only_real_settings_and_commands():
    import re

    from jobctl.dlq import dlq
    from jobctl.main import main as jobctl
    from jobsystem.settings import Settings

    guide = (ROOT / "docs" / "production.md").read_text()
    settings = {name.upper() for name in Settings.model_fields}
    # compose.yaml's own variables, which users put in .env (documented in .env.example)
    compose = set(re.findall(r"^([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    redis_replies = {"NOAUTH", "WRONGPASS", "OOM", "READONLY", "LOADING"}
    named = set(re.findall(r"`([A-Z][A-Z0-9_]{3,})(?:=[^`]*)?`", guide))
    assert named and named <= settings | compose | redis_replies, named - settings - compose
    for command, sub in re.findall(r"`jobctl ([a-z-]+)(?: ([a-z-]+))?", guide):
        assert command in jobctl.commands, command
        if command == "dlq":
            assert sub in dlq.commands, sub
    assert "jobctl migrate-queues" in guide and "consumer_timeout" in guide
    assert "docs/production.md" in (ROOT / "README.md").read_text()
