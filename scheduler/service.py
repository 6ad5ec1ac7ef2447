"""The running scheduler: APScheduler triggers, one leader that sends, the state store that remembers.

Every replica runs the same triggers. At each fire, the leader (see :mod:`jobsystem.store.leader`)
looks up the schedule's last sent fire in the state store, asks :func:`scheduler.plan.plan_fires`
what is due, sends it, and records the new last fire; a standby does nothing. A new leader (at
start, taking over from one that died, or this one again after its lease lapsed in a pause: the
lapse refused the fires due then) does the same for every schedule at once, which is how missed
fires are caught up.

Every message carries the idempotency key ``schedule:<id>:<fire time, UTC>``, built from the
*scheduled* time, so two replicas that both believe they lead, or a restart between a send and
its record, publish a fire once: the second send is dropped by the idempotency middleware, and
the worker's run guard would skip it anyway.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import dramatiq
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from jobsystem.observability.logs import get_logger
from jobsystem.privacy.outage_lines import log_addresses, log_outage
from jobsystem.settings import Settings
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.leader import LeaderLease
from scheduler.checkins import CheckIns
from scheduler.plan import plan_fires
from scheduler.schedules import Schedule
from scheduler.stopping import StopRequest
from scheduler.triggers import format_duration

logger = get_logger("scheduler")

#: The leader lease's name in the state store (namespaced by ``QUEUE_PREFIX``).
LEADER_LEASE = "scheduler:leader"
#: How soon a fire that could not be sent (RabbitMQ or the store down) is tried again.
RETRY_DELAY = timedelta(seconds=5)
#: Last fires are remembered at least this long (longer for schedules with longer periods).
LAST_FIRE_MIN_TTL = timedelta(days=30)


def utc_iso(moment: datetime) -> str:
    """``moment`` in UTC as ``2024-03-10T14:00:00Z`` (fire times are whole seconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def fire_key(schedule_id: str, fire_time: datetime) -> str:
    """The idempotency key of one fire: the same on every replica, unique per fire."""
    return f"schedule:{schedule_id}:{utc_iso(fire_time)}"


def fire_message_id(schedule_id: str, fire_time: datetime) -> str:
    """The message id of one fire, derived from its key: a fire sent again (a failed send tried
    again, a new leader catching up) is the same message, which its own pending key lets through,
    where a new id would be dropped as a duplicate of a message RabbitMQ may never have had."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, fire_key(schedule_id, fire_time)))


def last_fire_key(schedule_id: str) -> str:
    return f"scheduler:last-fire:{schedule_id}"


class Scheduler:
    """Sends the fires of ``schedules`` through ``broker`` while this process leads."""

    def __init__(
        self,
        schedules: list[Schedule],
        *,
        broker: dramatiq.Broker,
        store: StateStore,
        settings: Settings,
        checkins: CheckIns | None = None,
    ) -> None:
        self.schedules = {s.id: s for s in schedules if s.enabled}
        self.disabled = [s.id for s in schedules if not s.enabled]
        self.broker = broker
        self.store = store
        self.settings = settings
        self.checkins = checkins
        self.started_at = datetime.now(UTC)
        # One sending thread: one RabbitMQ connection (Dramatiq's are per thread), fires in order.
        self.aps = BackgroundScheduler(
            timezone=UTC,
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            # Every run looks at the store and sends all that is due: APScheduler's own misfire
            # handling (which needs a persistent job store) stays out of the way.
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self.lease = LeaderLease(
            store,
            LEADER_LEASE,
            ttl_ms=settings.scheduler_lease_ms,
            on_elected=self._on_elected,
            on_lost=self._on_lost,
        )
        self._locks = {schedule_id: threading.Lock() for schedule_id in self.schedules}
        self._skips_reported: dict[str, datetime | None] = {}
        #: Per schedule, the fire whose send failed last: its retries log a warning, not an error.
        self._failing: dict[str, datetime] = {}
        self._stop = StopRequest()

    # -- life cycle ------------------------------------------------------------------------------

    def run(self) -> None:
        """Schedule every entry, take part in the leader election, and block until :meth:`stop`."""
        now = datetime.now(UTC)
        takeover = self.settings.scheduler_lease_ms * 1.1 / 1000  # see jobsystem.store.leader
        for schedule in self.schedules.values():
            self.aps.add_job(
                self.fire, trigger=schedule.trigger, args=[schedule.id], id=schedule.id, name=schedule.id
            )
            next_fire = schedule.trigger.get_next_fire_time(None, now)
            logger.info(
                "schedule_loaded",
                schedule=schedule.id,
                actor=schedule.actor,
                spec=schedule.spec,
                queue=self.queue_of(schedule),
                misfire_grace=format_duration(schedule.misfire_grace),
                next_fire=next_fire.isoformat() if next_fire else None,
                next_fire_utc=utc_iso(next_fire) if next_fire else None,
            )
            if schedule.misfire_grace.total_seconds() < takeover:
                logger.warning(
                    "misfire_grace_below_takeover",
                    schedule=schedule.id,
                    misfire_grace=format_duration(schedule.misfire_grace),
                    takeover_s=round(takeover, 1),
                    hint="a take-over may skip fires: raise misfire_grace or lower SCHEDULER_LEASE_MS",
                )
        for schedule_id in self.disabled:
            logger.info("schedule_disabled", schedule=schedule_id)
        logger.info(
            "scheduler_started",
            schedules=len(self.schedules),
            owner=self.lease.owner,
            lease_ms=self.settings.scheduler_lease_ms,
            store="STATE_URL",  # by its setting and kind: an INFO line is a Sentry breadcrumb
            kind=self.store.kind,
        )
        log_addresses(logger, "scheduler_started", store=self.store.label)
        self.aps.start()
        if not self.lease.poll():
            logger.info("scheduler_standby", leader=self._holder())
        self.lease.start()
        self._stop.wait()
        logger.info("scheduler_stopping", signal=self._stop.signal)
        self.aps.shutdown(wait=True)  # a send under way finishes; queued runs see the stop and return
        self.lease.stop(release=True)  # a standby takes over at its next attempt
        logger.info("scheduler_stopped")

    def stop(self, signal_name: str | None = None) -> None:
        """Make :meth:`run` return; from any thread (a signal handler: :meth:`stop_on_signal`)."""
        self._stop.set(signal_name)

    def stop_on_signal(self, signal_name: str) -> None:
        """Make :meth:`run` return, from a signal handler (see ``scheduler.stopping``)."""
        self._stop.note_signal(signal_name)

    # -- firing ----------------------------------------------------------------------------------

    def fire(self, schedule_id: str, catch_up: bool = False) -> None:
        """Send what is due for one schedule. Run by its trigger, after an election (``catch_up``)
        and after a failed send; a standby returns at once."""
        if self._stop.is_set() or not self.lease.is_leader:
            return
        schedule = self.schedules[schedule_id]
        with self._locks[schedule_id]:
            now = datetime.now(UTC)
            try:
                stored = self.store.get(last_fire_key(schedule_id))
            except StoreUnavailable as exc:
                log_outage(logger, logging.WARNING, "schedule_state_unavailable", exc, schedule=schedule_id)
                self._retry(schedule_id)
                return
            last = parse_utc_iso(stored.decode()) if stored else None
            plan = plan_fires(
                schedule.trigger, last=last, now=now, started_at=self.started_at, grace=schedule.misfire_grace
            )
            if plan.skipped and self._skips_reported.get(schedule_id) != last:
                self._skips_reported[schedule_id] = last
                logger.warning(
                    "schedule_misfire_skipped",
                    schedule=schedule_id,
                    last_fire=utc_iso(last) if last else None,
                    misfire_grace=format_duration(schedule.misfire_grace),
                )
            if self.checkins is not None:
                self.checkins.given_up(schedule, last=last, due=plan.send)
            if plan.coalesced:
                logger.info(
                    "schedule_misfire_coalesced",
                    schedule=schedule_id,
                    missed=plan.coalesced + 1,
                    fire_time=utc_iso(plan.send[0]),
                )
            for index, fire_time in enumerate(plan.send):
                if self._stop.is_set() or not self.lease.is_leader:
                    return
                missed = catch_up or index < len(plan.send) - 1
                if not self._send(schedule, fire_time, missed=missed):
                    self._retry(schedule_id)
                    return

    def _send(self, schedule: Schedule, fire_time: datetime, *, missed: bool) -> bool:
        """Publish one fire (confirmed by RabbitMQ), then record it; False when it could not be sent."""
        options: dict[str, Any] = {
            "idempotency_key": fire_key(schedule.id, fire_time),
            # A fire can be sent again up to misfire_grace after its time: remember the key longer.
            "idempotency_ttl": max(
                self.settings.idempotency_ttl_ms, int(schedule.misfire_grace.total_seconds() * 2000)
            ),
            "schedule": schedule.id,
            "fire_time": utc_iso(fire_time),
        }
        if schedule.priority is not None:
            options["broker_priority"] = schedule.priority
        actor = self.broker.get_actor(schedule.actor)
        message = actor.message_with_options(args=schedule.args, kwargs=schedule.kwargs, **options)
        queue = message.queue_name if schedule.queue is None else self.settings.queue(schedule.queue)
        message = message.copy(queue_name=queue, message_id=fire_message_id(schedule.id, fire_time))
        late_ms = int((datetime.now(UTC) - fire_time).total_seconds() * 1000)
        if self.checkins is not None:
            self.checkins.started(schedule, fire_time, fire_key(schedule.id, fire_time))
        try:
            sent = self.broker.enqueue(message)
        except Exception as exc:  # RabbitMQ or the state store: the fire is tried again
            # An error (a Sentry event) for a fire's first failure, not one every 5 s retry.
            instant = fire_time.astimezone(UTC)  # the passes of a repeated hour are equal wall times
            retried = self._failing.get(schedule.id) == instant
            self._failing[schedule.id] = instant
            log_outage(
                logger,
                logging.WARNING if retried else logging.ERROR,
                "schedule_send_failed",
                exc,
                schedule=schedule.id,
                fire_time=utc_iso(fire_time),
                retry_in_s=RETRY_DELAY.total_seconds(),
            )
            return False  # its check-in stays open: closed once sent, or given up after the grace
        self._failing.pop(schedule.id, None)
        if self.checkins is not None:
            self.checkins.sent(schedule, fire_time)
        if sent.options.get("duplicate"):
            logger.info(
                "schedule_fire_duplicate",
                schedule=schedule.id,
                fire_time=utc_iso(fire_time),
                original_message_id=sent.message_id,
            )
        else:
            logger.info(
                "schedule_fired",
                schedule=schedule.id,
                actor=schedule.actor,
                fire_time=utc_iso(fire_time),
                message_id=sent.message_id,
                queue=sent.queue_name,
                late_ms=late_ms,
                missed=missed,
            )
        self._record(schedule, fire_time)
        return True

    def _record(self, schedule: Schedule, fire_time: datetime) -> None:
        """Remember the last fire sent, long enough to outlive the next one's grace."""
        following = schedule.trigger.get_next_fire_time(fire_time, fire_time)
        period = following - fire_time if following is not None else timedelta(0)
        ttl = max(LAST_FIRE_MIN_TTL, 2 * period + schedule.misfire_grace)
        try:
            self.store.set(
                last_fire_key(schedule.id), utc_iso(fire_time), ttl_ms=int(ttl.total_seconds() * 1000)
            )
        except StoreUnavailable as exc:
            # Sent but not recorded: the next look sends it again and its key drops the copy.
            log_outage(
                logger,
                logging.WARNING,
                "schedule_last_fire_unsaved",
                exc,
                schedule=schedule.id,
                fire_time=utc_iso(fire_time),
            )

    def _retry(self, schedule_id: str) -> None:
        if not self._stop.is_set():
            self.aps.add_job(
                self.fire,
                "date",
                run_date=datetime.now(UTC) + RETRY_DELAY,
                args=[schedule_id, True],
                id=f"retry:{schedule_id}",
                replace_existing=True,
            )

    # -- leadership ------------------------------------------------------------------------------

    def _on_elected(self) -> None:
        logger.info("scheduler_leader", owner=self.lease.owner)
        for schedule_id in self.schedules:
            self.aps.add_job(
                self.fire,
                "date",
                args=[schedule_id, True],
                id=f"catch-up:{schedule_id}",
                replace_existing=True,
            )

    def _on_lost(self) -> None:
        """Say why this process stopped leading. Called under the lease's lock: the holder is
        looked up on APScheduler's thread, since a store that hangs (SQLite's busy timeout, a
        Redis socket timeout) would otherwise hold up the renewals and, after a lapse, the
        catch-up of the term that follows at once."""
        if self._stop.is_set():
            return
        if self.lease.renewed:  # a pause outlasted the lease, nobody took it: leads again now
            logger.info("scheduler_lease_lapsed", renewed=True, hint="fires refused in the gap are caught up")
            return
        self.aps.add_job(self._standby, id="standby", replace_existing=True)

    def _standby(self) -> None:
        if not self.lease.is_leader:
            logger.warning("scheduler_standby", leader=self._holder(), reason="lease lost")

    def _holder(self) -> str | None:
        try:
            return self.store.lease_holder(LEADER_LEASE)
        except StoreUnavailable:
            return None

    def queue_of(self, schedule: Schedule) -> str:
        return queue_of(schedule, self.broker, self.settings)


def queue_of(schedule: Schedule, broker: dramatiq.Broker, settings: Settings) -> str:
    """The queue a schedule's messages go to: its ``queue`` (with ``QUEUE_PREFIX``) or its actor's."""
    if schedule.queue is not None:
        return settings.queue(schedule.queue)
    return str(broker.get_actor(schedule.actor).queue_name)
