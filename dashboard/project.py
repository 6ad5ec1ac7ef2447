"""The dashboard's one door into the project's code: every import of it goes through this module.

The project's modules are being regrouped into a core package; when they move, this file (and
only it) is re-pointed. Everything the dashboard needs is re-exported here under a stable name,
and :class:`Project` bundles what one running dashboard uses (settings, store, broker and the
store backends built on it).

Importing this module imports ``actors``, which validates the settings and builds the broker:
``jobctl dashboard`` does that first, so bad settings are one line and exit code 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any

from actors import dead_letter_ops
from actors.broker import DEAD_LETTER_SUFFIX, ProjectBroker, dead_letter_queue
from actors.health import HealthReport, QueueHealth, check, missing_queues
from actors.privacy import get_scrubber
from actors.settings import Settings, redact_url
from middleware.audit_store import AuditBackend, audit_backend
from middleware.dead_letter_index import DeadLetterEntry, DeadLetterFilter, IndexBackend
from middleware.heartbeat_store import HeartbeatBackend, heartbeat_backend
from middleware.idempotency import Idempotency
from middleware.job_index import JobFilter
from middleware.ratelimit import Limit
from middleware.ratelimit_store import BucketBackend, Level, bucket_backend
from middleware.sorted_index import Cursor
from middleware.state import StateStore, StoreUnavailable
from middleware.status_store import STATE_RANKS, JobStatus, StatusBackend, status_backend
from scheduler.schedules import DEFAULT_FILE, Schedule, ScheduleError, load_schedules
from scheduler.service import LEADER_LEASE, last_fire_key, queue_of

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "LEADER_LEASE",
    "STATE_RANKS",
    "Cursor",
    "DeadLetterEntry",
    "DeadLetterFilter",
    "HealthReport",
    "JobFilter",
    "JobStatus",
    "Level",
    "Limit",
    "Project",
    "QueueHealth",
    "Schedule",
    "ScheduleError",
    "StoreUnavailable",
    "check",
    "dead_letter_ops",
    "dead_letter_queue",
    "last_fire_key",
    "missing_queues",
    "queue_of",
    "redact_url",
]


@dataclass
class Project:
    """The project as one dashboard process sees it.

    Parameters:
      settings: the validated settings.
      store: the shared state store.
      broker: the project's broker (replays publish through it, with confirms).
      schedules_file: the schedules the schedules page shows (``SCHEDULES_FILE`` or the default).
    """

    settings: Settings
    store: StateStore
    broker: ProjectBroker
    schedules_file: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_actors(cls, actors: ModuleType) -> Project:
        """The project ``import actors`` built."""
        settings: Settings = actors.settings
        return cls(settings, actors.store, actors.broker, settings.schedules_file or DEFAULT_FILE)

    @cached_property
    def status(self) -> StatusBackend:
        return status_backend(self.store)

    @cached_property
    def audit(self) -> AuditBackend:
        return audit_backend(self.store)

    @cached_property
    def heartbeats(self) -> HeartbeatBackend:
        return heartbeat_backend(self.store)

    @cached_property
    def buckets(self) -> BucketBackend:
        return bucket_backend(self.store)

    @property
    def dead_letter_index(self) -> IndexBackend | None:
        index = self.broker.dead_letter_index
        return index.backend if index is not None else None

    @cached_property
    def idempotency(self) -> Idempotency | None:
        return next((m for m in self.broker.middleware if isinstance(m, Idempotency)), None)

    def scrub(self, text: str) -> str:
        """The project's scrubber (personal data and configured secrets removed)."""
        return get_scrubber(self.settings).text(text)

    def load_schedules(self) -> list[Schedule]:
        return load_schedules(
            self.schedules_file, self.broker.actors, max_priority=self.settings.rabbitmq_max_priority
        )
