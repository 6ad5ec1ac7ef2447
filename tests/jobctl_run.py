"""Run ``jobctl`` as an operator does, in a subprocess on a test's queue prefix."""

from __future__ import annotations

import os
import subprocess

from tests.support import BIN, ROOT


def jobctl(prefix: str, *args: str, check: bool = True, **settings: str) -> subprocess.CompletedProcess[str]:
    """``jobctl ARGS`` with ``QUEUE_PREFIX=prefix`` and ``settings`` as environment variables;
    unless ``check`` is false it must exit 0."""
    env = {**os.environ, "QUEUE_PREFIX": prefix, "LOG_LEVEL": "WARNING", **settings}
    result = subprocess.run(
        [str(BIN / "jobctl"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result
