"""The dashboard's one door into the project's code: every import of it goes through this module.

Everything the dashboard needs is re-exported here under a stable name, so a move in the project
re-points this file only; :class:`Project` bundles what one running dashboard uses (the system
:func:`jobsystem.system.get_system` built, and the store backends built on its store).

``jobctl dashboard`` builds the system first (settings validated, actors declared), so bad
settings are one line and exit code 2; importing this module builds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from jobsystem.dramatiq_internals import release_thread_connection
from jobsystem.ops import dead_letters as dead_letter_ops
from jobsystem.ops.dead_letter_stops import ReadStopped
from jobsystem.ops.health import HealthReport, QueueHealth, check
from jobsystem.ops.outages import store_outage, unreachable
from jobsystem.ops.queue_counts import dead_letter_counts, missing_queues
from jobsystem.ops.scope import ForeignQueue, project_queues
from jobsystem.rabbitmq.broker import DEAD_LETTER_SUFFIX, ProjectBroker, dead_letter_queue
from jobsystem.runtime.actor_names import actor_label
from jobsystem.settings import Settings
from jobsystem.store.audit import AuditBackend, audit_backend
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.buckets import BucketBackend, Level, bucket_backend
from jobsystem.store.dead_letter_index import DeadLetterEntry, DeadLetterFilter, IndexBackend
from jobsystem.store.heartbeats import HeartbeatBackend, heartbeat_backend
from jobsystem.store.job_index import JobFilter
from jobsystem.store.sorted_index import Cursor
from jobsystem.store.status import StatusBackend, status_backend
from jobsystem.store.status_records import STATE_RANKS, JobStatus
from jobsystem.system import System, get_system
from jobsystem.urls import redact_url
from jobsystem.workflows import cancel
from middleware.idempotency import Idempotency
from scheduler.schedules import DEFAULT_FILE, Schedule, ScheduleError, load_schedules
from scheduler.service import LEADER_LEASE, last_fire_key, queue_of

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "LEADER_LEASE",
    "STATE_RANKS",
    "Cursor",
    "DeadLetterEntry",
    "DeadLetterFilter",
    "ForeignQueue",
    "HealthReport",
    "JobFilter",
    "JobStatus",
    "Level",
    "Project",
    "QueueHealth",
    "ReadStopped",
    "Schedule",
    "ScheduleError",
    "StoreUnavailable",
    "actor_label",
    "cancel",
    "check",
    "dead_letter_counts",
    "dead_letter_ops",
    "dead_letter_queue",
    "last_fire_key",
    "missing_queues",
    "project_queues",
    "queue_of",
    "redact_url",
    "release_thread_connection",
    "store_outage",
    "unreachable",
]


@dataclass
class Project:
    """The project as one dashboard process sees it.

    Parameters:
      system: the process's system (settings, scrubber, store, broker).
      schedules_file: the schedules the schedules page shows (``SCHEDULES_FILE`` or the default).
    """

    system: System
    schedules_file: Path = DEFAULT_FILE

    @classmethod
    def from_system(cls, system: System | None = None) -> Project:
        """The project of ``system``, by default this process's (:func:`get_system`); declare
        the actors first (``import actors``): schedules and key searches need them."""
        system = system or get_system()
        return cls(system, system.settings.schedules_file or DEFAULT_FILE)

    @property
    def settings(self) -> Settings:
        return self.system.settings

    @property
    def store(self) -> StateStore:
        return self.system.store

    @property
    def broker(self) -> ProjectBroker:
        return self.system.broker

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
        return self.system.scrubber.text(text)

    def load_schedules(self) -> list[Schedule]:
        return load_schedules(
            self.schedules_file, self.broker.actors, max_priority=self.settings.rabbitmq_max_priority
        )
