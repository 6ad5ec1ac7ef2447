"""Newest-first listings with filters, paged by cursor, on both state store backends.

The job index (:mod:`jobsystem.store.job_index`) and the dead-letter index
(:mod:`jobsystem.store.dead_letter_index`) answer "the 50 newest entries matching these filters,
after this one" without scanning everything:

- Redis: one sorted set per filter value (score: a time in ms; member: the entry's id). A page
  walks the most selective set from its newest end and keeps the members found in every other
  filter's set (``ZSCORE``), in one Lua call, so a page costs O(log n + entries looked at). A
  walk that looks at ``budget`` entries without filling the page stops and hands back a cursor:
  a rare filter combination over a huge set costs pages that may come back short, never a scan.
- SQLite: a table with an index per filter, read with a row-value comparison on ``(time, id)``
  that the index serves in order.

A :class:`Cursor` is the last entry of a page (its time and id); the next page starts strictly
after it, so entries added meanwhile at the head never shift a page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jobsystem.store.redis import RedisStore, reply_text

__all__ = ["Cursor", "Walk", "redis_walk"]


@dataclass(frozen=True)
class Cursor:
    """A position in a newest-first listing: entries after it are older, or as old with a
    smaller id."""

    at: int
    id: str

    def encode(self) -> str:
        return f"{self.at}.{self.id}"

    @property
    def seq(self) -> int:
        """The id as SQLite's row number (0 when it is not one): the tie-breaker of its pages."""
        return int(self.id) if _ROW_NUMBER.fullmatch(self.id) else 0

    @classmethod
    def decode(cls, text: str | None) -> Cursor | None:
        """The cursor ``text`` names; None for none or one that is not a cursor (first page). Its
        time must fit SQLite's integers (a request's cursor is anyone's text)."""
        if not text:
            return None
        at, _, ident = text.partition(".")
        return cls(int(at), ident) if _TIME.fullmatch(at) else None


_TIME = re.compile(r"-?[0-9]{1,18}")
_ROW_NUMBER = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class Walk:
    """One page of ids, newest first, with the cursor of the next page (None: no more)."""

    entries: list[tuple[str, int]]
    next: Cursor | None


_WALK = """
local max, after, min = ARGV[1], ARGV[2], ARGV[3]
local limit, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local found, scanned, offset = {}, 0, 0
local last_m, last_s = nil, nil
while scanned < budget do
  local rows = redis.call('ZREVRANGEBYSCORE', KEYS[1], max, min, 'WITHSCORES', 'LIMIT', offset, 256)
  if #rows == 0 then return {found, 0} end
  offset = offset + #rows / 2
  for j = 1, #rows, 2 do
    local m, s = rows[j], rows[j + 1]
    scanned = scanned + 1
    if not (after ~= '' and s == max and m >= after) then
      local keep = true
      for k = 2, #KEYS do
        if not redis.call('ZSCORE', KEYS[k], m) then keep = false break end
      end
      if keep then
        if #found >= 2 * limit then return {found, 1} end
        found[#found + 1] = m
        found[#found + 1] = s
      end
    end
    last_m, last_s = m, s
    if scanned >= budget then break end
  end
end
return {found, 2, last_m, last_s}
"""


def redis_walk(
    store: RedisStore,
    primary: str,
    verify: list[str],
    cursor: Cursor | None,
    limit: int,
    *,
    since: int | None = None,
    budget: int = 20_000,
) -> Walk:
    """Up to ``limit`` members of the sorted set ``primary`` (full key names) that are also in
    every set of ``verify``, newest first, after ``cursor``, with scores of at least ``since``."""
    maximum = str(cursor.at) if cursor else "+inf"
    args = [maximum, cursor.id if cursor else "", str(since) if since is not None else "-inf", limit, budget]
    with store.errors():
        reply = store.script(_WALK)(keys=[primary, *verify], args=args)
    flat, more = reply[0], int(reply[1])
    entries = [(reply_text(flat[i]), int(float(reply_text(flat[i + 1])))) for i in range(0, len(flat), 2)]
    if more == 1 and entries:
        return Walk(entries, Cursor(entries[-1][1], entries[-1][0]))
    if more == 2:  # the budget ran out: go on from the last entry looked at
        return Walk(entries, Cursor(int(float(reply_text(reply[3]))), reply_text(reply[2])))
    return Walk(entries, None)
