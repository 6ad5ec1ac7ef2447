"""Configuration errors met at start-up, reported as one line each and exit code 2.

Two kinds: invalid settings (:class:`~jobsystem.settings.SettingsError`, from
:func:`~jobsystem.system.build_system`) and an actor whose ``rate_limit`` does not fit
``RATE_LIMITS`` (:class:`~jobsystem.limits.RateLimitConfigError`, raised while the actor is
declared). The second becomes the first, naming ``RATE_LIMITS``: one kind for every entry point.

``jobctl`` and ``python -m scheduler`` catch it and print its lines (``jobctl.project``).
``dramatiq actors`` cannot: Dramatiq's CLI imports ``actors`` in each worker process, logs an
ImportError *with its traceback* and lets anything else crash the process with one. So inside a
process the ``dramatiq`` command started, :func:`configuration_checked` prints the lines itself
and raises ``SystemExit(2)``, which multiprocessing turns into that exit code quietly; Dramatiq's
parent then stops the other workers and exits with code 2 too. Anywhere else (an application
importing ``actors`` to send messages) the error propagates as an exception.
"""

from __future__ import annotations

import multiprocessing
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from jobsystem.dramatiq_internals import StreamablePipe
from jobsystem.limits import RateLimitConfigError
from jobsystem.settings import SettingsError

__all__ = ["EXIT_CONFIG", "configuration_checked"]

#: The exit code of a process stopped by its configuration (Dramatiq's for an import error).
EXIT_CONFIG = 2


def _in_dramatiq_worker() -> bool:
    """Whether the ``dramatiq`` command started this process: it pipes the output to its parent
    (once logging is configured, through a ``BatchedStream`` whose ``stream`` is that pipe)."""
    return isinstance(sys.stderr, StreamablePipe) or isinstance(
        getattr(sys.stderr, "stream", None), StreamablePipe
    )


def _reports_for_the_group() -> bool:
    """Whether this worker process prints the error: every worker meets the same one, and
    multiprocessing names Dramatiq's workers Process-1, Process-2, ... in the order they start."""
    found = re.fullmatch(r"Process-(?:\d+:)*(\d+)", multiprocessing.current_process().name)
    return found is None or found[1] == "1"


@contextmanager
def configuration_checked() -> Iterator[None]:
    """Around a start-up step: a configuration error becomes :class:`SettingsError`, and in a
    Dramatiq worker process one line per problem on stderr and exit code 2."""
    try:
        yield
    except (SettingsError, RateLimitConfigError) as exc:
        error = exc if isinstance(exc, SettingsError) else SettingsError([f"RATE_LIMITS: {exc}"])
        if not _in_dramatiq_worker():
            raise error from None
        if _reports_for_the_group():
            # Straight to the process's stderr: Dramatiq's parent stops relaying its workers'
            # output once they have all exited, and may drop what the last one wrote.
            stream = sys.__stderr__ or sys.stderr
            stream.write(error.report("dramatiq"))
            stream.flush()
        raise SystemExit(EXIT_CONFIG) from None
