"""The package ``dramatiq actors`` imports: the system, whose broker is global, then the actors.

Dramatiq binds an actor to the global broker when it is declared, so the system comes first.
"""

from jobsystem.startup import configuration_checked
from jobsystem.system import get_system

get_system()
with configuration_checked():  # an actor's rate_limit that RATE_LIMITS lacks: exit 2, one line
    from actors import emails, health, media, reports

__all__ = ["emails", "health", "media", "reports"]
