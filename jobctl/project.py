"""Load the project (settings, broker, actors) once for a command, turning bad settings into a clean
exit, and scrub everything the command prints from then on (:mod:`jobctl.output`)."""

from __future__ import annotations

import logging
import sys
from types import ModuleType

import click

#: Exit codes shared by the commands.
EXIT_OK, EXIT_DEGRADED, EXIT_UNREACHABLE = 0, 1, 2


def load_actors() -> ModuleType:
    """Import ``actors`` (validating settings); on bad settings print what is wrong and exit 2."""
    try:
        import actors
    except ImportError as exc:
        if type(exc).__name__ != "SettingsError":
            raise
        click.echo(f"jobctl: {exc}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    # A command reports an unreachable broker itself; pika's own account of it is noise here.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    from actors.privacy import get_scrubber
    from jobctl.output import protect_output

    protect_output(get_scrubber(actors.settings).text)  # every line printed from here on
    return actors
