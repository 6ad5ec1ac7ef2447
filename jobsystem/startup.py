"""Configuration errors met while :mod:`actors` starts, reported as one line each, exit code 2.

Two kinds surface when ``actors`` is imported: invalid settings (:class:`SettingsError`) and an
actor whose ``rate_limit`` does not fit ``RATE_LIMITS`` (``RateLimitConfigError``, raised while
the actor is declared; ``RATE_LIMITS='{}'`` leaves the reference ``send_email`` without its
``smtp`` bucket). The second becomes the first, naming ``RATE_LIMITS``: one kind for every
entry point to report.

``jobctl`` and ``python -m scheduler`` catch it around their import of ``actors``
(``jobctl.project``). ``dramatiq actors`` cannot: Dramatiq's CLI imports ``actors`` in each worker
process, logs an ImportError *with its traceback* and lets anything else crash the process with
one. So inside a process the ``dramatiq`` command started, :func:`configuration_checked` prints
the lines itself and raises ``SystemExit(2)``, which multiprocessing turns into that exit code
quietly; Dramatiq's parent then stops the other workers and exits with code 2 too. Imported as a
library (an application sending messages), the error propagates as an exception.
"""

from __future__ import annotations

import multiprocessing
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from dramatiq.compat import StreamablePipe

from jobsystem.settings import SettingsError
from middleware.ratelimit import RateLimitConfigError

__all__ = ["EXIT_CONFIG", "configuration_checked"]

#: The exit code of a process stopped by its configuration (Dramatiq's for an import error).
EXIT_CONFIG = 2


def _in_dramatiq_worker() -> bool:
    """Whether the ``dramatiq`` command started this process: it pipes the output to its parent."""
    return isinstance(sys.stderr, StreamablePipe)


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
