"""An index of the dead letters in the state store, so a page of them never reads a queue.

RabbitMQ cannot seek: the 10,000th dead letter of a queue is reached only by taking the 9,999
before it, and a reader holds what it took until it lets go (other readers meanwhile see a
shorter queue). The dashboard therefore lists dead letters from this index, newest first, by
queue, actor, exception and time, and touches RabbitMQ only to act on them.

- Written by the worker right after RabbitMQ confirmed a dead letter, with the record the dead
  letter carries in its ``x-dl-*`` headers (error and traceback scrubbed already): deferred and
  batched by :mod:`jobsystem.rabbitmq.dead_letter_indexer`, never blocking the consumer.
- Removed by the operations that remove dead letters (``jobctl dlq retry|purge``, the dashboard's
  actions) once RabbitMQ has acked them.
- Bounded like the queues: entries older than ``DEAD_LETTER_TTL_MS`` and past
  ``DEAD_LETTER_MAX_LENGTH`` per queue are trimmed as new ones come.
- Rebuilt for one queue by a re-index (a full read of the queue) when it disagrees with
  RabbitMQ's count: dead letters from before the index existed, moved by ``migrate-queues``,
  expired, or purged outside the project's tools.

One entry per (queue, message id); a message dead-lettered twice counts two ``copies``.
Redis: records in the hash ``dl:rec`` (field ``<queue>|<message id>``), sorted sets per filter
value (:mod:`jobsystem.store.sorted_index`), counts per queue in ``dl:count``, distinct actors and
exceptions in ``dl:facet:a`` / ``dl:facet:e``; a re-index's entries kept aside in the list
``dl:reindex:<random>`` (expiring) until one script swaps them in. SQLite: the table ``dead_letter_index``
(:mod:`jobsystem.store.dead_letter_index_sqlite`).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

from jobsystem.store.base import Backends, StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore, reply_text
from jobsystem.store.sorted_index import Cursor, redis_walk

__all__ = [
    "DeadLetterEntry",
    "DeadLetterFilter",
    "IndexBackend",
    "IndexPage",
    "RedisIndex",
    "dead_letter_index",
]


@dataclass(frozen=True)
class DeadLetterEntry:
    """What the index knows of one dead letter (times in ms since the epoch)."""

    queue: str
    message_id: str
    actor: str
    reason: str
    exception: str
    error: str
    traceback: str
    attempts: int
    enqueued_at: int | None
    failed_at: int
    copies: int = 1
    #: How many times its job had been replayed from the dead letters (None: not known, its body
    #: not a message or indexed before the index kept it): what ``purge --replays`` matches.
    replays: int | None = None

    @property
    def member(self) -> str:
        return f"{self.queue}|{self.message_id}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeadLetterEntry:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a listing shows; None matches all (``since``: ms, failed at or after).
    ``exception=""`` selects the dead letters without an exception (rejected, aged out), as they
    are indexed."""

    queue: str | None = None
    actor: str | None = None
    exception: str | None = None
    since: int | None = None


@dataclass(frozen=True)
class IndexPage:
    entries: list[DeadLetterEntry]
    next: Cursor | None


class IndexBackend(ABC):
    """The index operations, one implementation per store backend."""

    @abstractmethod
    def add(self, entries: list[DeadLetterEntry], *, ttl_ms: int | None, max_length: int | None) -> None:
        """Count one more copy of each entry, then trim what the queue's bounds drop."""

    @abstractmethod
    def remove(self, items: list[tuple[str, str]]) -> None:
        """Count one copy less of each (queue, message id); an entry without copies goes."""

    @abstractmethod
    def clear(self, queue: str) -> None:
        """Forget every entry of ``queue`` (before a re-index)."""

    @abstractmethod
    def get(self, queue: str, message_id: str) -> DeadLetterEntry | None: ...

    @abstractmethod
    def page(self, dl_filter: DeadLetterFilter, cursor: Cursor | None, limit: int) -> IndexPage:
        """Entries matching ``dl_filter``, newest failure first."""

    @abstractmethod
    def counts(self) -> dict[str, int]:
        """Dead letters (copies) per queue."""

    @abstractmethod
    def facets(self) -> dict[str, list[str]]:
        """The distinct ``actor`` and ``exception`` values indexed (for filter menus)."""

    def replace(self, queue: str, entries: list[DeadLetterEntry], chunk: int = 500) -> None:
        """Make ``entries`` the whole index of ``queue`` (a re-index), ``chunk`` per round trip."""
        self.clear(queue)
        for start in range(0, len(entries), chunk):
            self.add(entries[start : start + chunk], ttl_ms=None, max_length=None)


_ADD = """
local ns, ttl, max_length, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rec = ns .. 'dl:rec'
local function sets(e)
  local ix = ns .. 'dl:ix:'
  return {ix .. 'all', ix .. 'q:' .. e.queue, ix .. 'a:' .. e.actor, ix .. 'e:' .. e.exception}
end
local function drop(member)
  local raw = redis.call('HGET', rec, member)
  if not raw then return end
  local e = cjson.decode(raw)
  redis.call('HDEL', rec, member)
  for _, set in ipairs(sets(e)) do redis.call('ZREM', set, member) end
  redis.call('HINCRBY', ns .. 'dl:count', e.queue, -e.copies)
  for facet, value in pairs({a = e.actor, e = e.exception}) do
    if redis.call('HINCRBY', ns .. 'dl:facet:' .. facet, value, -1) <= 0 then
      redis.call('HDEL', ns .. 'dl:facet:' .. facet, value)
    end
  end
end
if ARGV[5] == 'remove' then
  for i = 6, #ARGV do
    local raw = redis.call('HGET', rec, ARGV[i])
    if raw then
      local e = cjson.decode(raw)
      if e.copies > 1 then
        e.copies = e.copies - 1
        redis.call('HSET', rec, ARGV[i], cjson.encode(e))
        redis.call('HINCRBY', ns .. 'dl:count', e.queue, -1)
      else
        drop(ARGV[i])
      end
    end
  end
  return 0
end
local function clear(queue)
  for _, member in ipairs(redis.call('ZRANGE', ns .. 'dl:ix:q:' .. queue, 0, -1)) do drop(member) end
  redis.call('HDEL', ns .. 'dl:count', queue)
end
if ARGV[5] == 'clear' then
  clear(ARGV[6])
  return 0
end
local queues = {}
local function file(e)
  local member = e.queue .. '|' .. e.message_id
  local raw = redis.call('HGET', rec, member)
  if raw then  -- another copy: filed again under this copy's record
    local copies = cjson.decode(raw).copies
    drop(member)
    e.copies = copies + 1
    redis.call('HINCRBY', ns .. 'dl:count', e.queue, copies)
  end
  redis.call('HINCRBY', ns .. 'dl:facet:a', e.actor, 1)
  redis.call('HINCRBY', ns .. 'dl:facet:e', e.exception, 1)
  redis.call('HSET', rec, member, cjson.encode(e))
  for _, set in ipairs(sets(e)) do redis.call('ZADD', set, e.failed_at, member) end
  redis.call('HINCRBY', ns .. 'dl:count', e.queue, 1)
  queues[e.queue] = true
end
if ARGV[5] == 'stage' then  -- a re-index's entries, kept aside under a key of their own
  redis.call('RPUSH', ARGV[6], unpack(ARGV, 7))
  redis.call('PEXPIRE', ARGV[6], 600000)
  return 0
end
if ARGV[5] == 'swap' then  -- the staged entries made the queue's whole index, at once
  local staged, queue = ARGV[6], ARGV[7]
  if redis.call('LLEN', staged) ~= tonumber(ARGV[8]) then return -1 end  -- expired: change nothing
  clear(queue)
  for start = 0, tonumber(ARGV[8]) - 1, 500 do
    for _, raw in ipairs(redis.call('LRANGE', staged, start, start + 499)) do file(cjson.decode(raw)) end
  end
  redis.call('DEL', staged)
  return 0
end
for i = 6, #ARGV do file(cjson.decode(ARGV[i])) end
if ttl then
  local old = redis.call('ZRANGEBYSCORE', ns .. 'dl:ix:all', '-inf', now - ttl, 'LIMIT', 0, 1000)
  for _, member in ipairs(old) do drop(member) end
end
if max_length then
  for queue in pairs(queues) do
    local over = redis.call('ZCARD', ns .. 'dl:ix:q:' .. queue) - max_length
    if over > 0 then
      local oldest = redis.call('ZRANGE', ns .. 'dl:ix:q:' .. queue, 0, over - 1)
      for _, member in ipairs(oldest) do drop(member) end
    end
  end
end
return 0
"""


class RedisIndex(IndexBackend):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._script = store.script(_ADD)

    def _run(
        self, mode: str, items: list[Any], ttl_ms: int | None = None, max_length: int | None = None
    ) -> Any:
        now = self.store.now_ms() if ttl_ms else 0
        args = [self.store.namespace, ttl_ms or "", max_length or "", now, mode, *items]
        with self.store.errors():
            return self._script(keys=[], args=args)

    def add(self, entries: list[DeadLetterEntry], *, ttl_ms: int | None, max_length: int | None) -> None:
        if entries:
            self._run("add", [json.dumps(e.to_dict()) for e in entries], ttl_ms, max_length)

    def remove(self, items: list[tuple[str, str]]) -> None:
        if items:
            self._run("remove", [f"{queue}|{message_id}" for queue, message_id in items])

    def clear(self, queue: str) -> None:
        self._run("clear", [queue])

    def replace(self, queue: str, entries: list[DeadLetterEntry], chunk: int = 500) -> None:
        """Make ``entries`` the whole index of ``queue`` at once: they are kept aside under a key
        of the namespace's own (``dl:reindex:<random>``, expiring), ``chunk`` per round trip, then
        one script clears the queue's entries and files them (the index is several structures
        shared by every queue: no single key to rename). A store that fails before that script
        leaves the index as it was, and the key is deleted (or expires, if the store is down)."""
        staged = self.store.key(f"dl:reindex:{uuid.uuid4().hex}")
        try:
            for start in range(0, len(entries), chunk):
                self._run(
                    "stage", [staged, *(json.dumps(e.to_dict()) for e in entries[start : start + chunk])]
                )
            if self._run("swap", [staged, queue, len(entries)]) == -1:
                raise StoreUnavailable("redis: the re-index's entries expired before they were filed")
        except BaseException:
            with contextlib.suppress(StoreUnavailable), self.store.errors():
                self.store.client.delete(staged)
            raise

    def _records(self, members: list[str]) -> list[DeadLetterEntry]:
        if not members:
            return []
        with self.store.errors():
            raw = self.store.client.hmget(self.store.key("dl:rec"), members)
        return [DeadLetterEntry.from_dict(json.loads(value)) for value in raw if value is not None]

    def get(self, queue: str, message_id: str) -> DeadLetterEntry | None:
        found = self._records([f"{queue}|{message_id}"])
        return found[0] if found else None

    def page(self, dl_filter: DeadLetterFilter, cursor: Cursor | None, limit: int) -> IndexPage:
        base = self.store.key("dl:ix:")
        given = [
            f"{base}{kind}:{value}"
            for kind, value in (("q", dl_filter.queue), ("a", dl_filter.actor), ("e", dl_filter.exception))
            if value is not None
        ]
        primary, verify = (given[0], given[1:]) if given else (f"{base}all", [])
        walk = redis_walk(self.store, primary, verify, cursor, limit, since=dl_filter.since)
        return IndexPage(self._records([member for member, _ in walk.entries]), walk.next)

    def counts(self) -> dict[str, int]:
        with self.store.errors():
            raw = self.store.client.hgetall(self.store.key("dl:count"))
        return {reply_text(k): int(v) for k, v in raw.items() if int(v) > 0}

    def facets(self) -> dict[str, list[str]]:
        with self.store.errors():
            actors = self.store.client.hkeys(self.store.key("dl:facet:a"))
            exceptions = self.store.client.hkeys(self.store.key("dl:facet:e"))
        return {
            "actor": sorted(reply_text(a) for a in actors),
            "exception": sorted(reply_text(e) for e in exceptions),
        }


def dead_letter_index(store: StateStore) -> IndexBackend:
    """The dead-letter index operations for ``store``'s backend."""
    # Imported here: the SQLite backend builds on this module's entries and interface.
    from jobsystem.store.dead_letter_index_sqlite import SqliteIndex

    return store.operations(Backends(redis=RedisIndex, sqlite=SqliteIndex))
