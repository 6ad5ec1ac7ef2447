"""The SQLite workflow tables, and the triggers that keep them right whichever release writes.

``workflow_fields`` holds the fields a Redis hash would, one row each; ``workflow_done`` the
members counted, per step (a member's end is one ``INSERT OR IGNORE`` there, in every release).
Only the ``record`` row carries the workflow's expiry; every other row of a recorded workflow
has :data:`FOLLOWS` and lives as long as its record.

The previous release counted a step's rows with ``COUNT(*)``, gave every row of a workflow the
longest expiry among them on each write, and swept the rows past their own expiry. Its workers
and senders may share the file with this release's, because the triggers keep, whoever writes:

- ``workflow_done_counted``: each member counted adds one to its step's field ``n:<step>`` (the
  counter's only writer), so a finish costs the same whatever the step's size, and counts right.
- ``workflow_row_follows`` and ``workflow_row_follows_update``: a row of a recorded workflow
  written with an expiry of its own gets :data:`FOLLOWS`, so the old sweep never deletes the
  fields of a workflow whose record this release kept alive.
- ``workflow_record_expiry``: the old write's longest expiry is :data:`FOLLOWS` (never); the
  record keeps a real one, the later of the one it had and now plus the workflow's TTL (its field
  ``ttl``, written when it was created, by ``workflow_record_ttl`` for the previous release, by
  the upgrade below for a workflow recorded before it).
- ``workflow_record_deleted``: a deleted record (the old sweep deletes it at its expiry, this
  release's deletes nothing else) takes the workflow's other rows and counted members with it.

Applied to a file of the previous release (the tables, no trigger), the schema first sets every
step's counter from its rows, deletes the rows left without a record, makes the others follow
their record and gives each record its ``ttl``, once: each upgrade step runs only while its
trigger does not exist yet, and all of them run in one ``BEGIN IMMEDIATE`` transaction
(:meth:`~jobsystem.store.sqlite.SqliteStore.ensure_schema`). A record's ``ttl`` is the time from
its workflow's creation (the record's ``created_at``, which every release writes; now, when a
record has none) to its expiry: the TTL it was created with, or more when it was counted on since
(no write says by how much). Too long keeps a finished workflow's rows a while longer; too short
would expire one whose members still run, its next step never sent.
"""

from __future__ import annotations

__all__ = ["FOLLOWS", "SCHEMA", "TABLES"]

#: The ``expires_at`` of a row that lives as long as its workflow's ``record`` row.
FOLLOWS = 2**62

#: The tables, as every release since workflows creates them.
TABLES = """
CREATE TABLE IF NOT EXISTS workflow_fields (
    wid TEXT NOT NULL,
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (wid, field)
);
CREATE TABLE IF NOT EXISTS workflow_done (
    wid TEXT NOT NULL,
    step INTEGER NOT NULL,
    member TEXT NOT NULL,
    PRIMARY KEY (wid, step, member)
);
CREATE INDEX IF NOT EXISTS workflow_fields_expiry ON workflow_fields (expires_at);
"""


def _absent(trigger: str) -> str:
    """An SQL condition: ``trigger`` does not exist yet (the file is upgraded now)."""
    return f"NOT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = '{trigger}')"


#: The store's clock in SQL (:meth:`~jobsystem.store.sqlite.SqliteStore.now_ms`: Unix ms).
_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"

_RECORDED = "EXISTS (SELECT 1 FROM workflow_fields WHERE wid = NEW.wid AND field = 'record')"

_COUNTER = f"""
INSERT INTO workflow_fields (wid, field, value, expires_at)
SELECT wid, 'n:' || step, COUNT(*), {FOLLOWS} FROM workflow_done
WHERE {_absent("workflow_done_counted")}
GROUP BY wid, step
ON CONFLICT (wid, field) DO UPDATE SET value = excluded.value;
CREATE TRIGGER IF NOT EXISTS workflow_done_counted AFTER INSERT ON workflow_done
BEGIN
    INSERT INTO workflow_fields (wid, field, value, expires_at)
    VALUES (NEW.wid, 'n:' || NEW.step, '1', {FOLLOWS})
    ON CONFLICT (wid, field) DO UPDATE SET value = CAST(value AS INTEGER) + 1;
END;
"""

_UNRECORDED = "wid NOT IN (SELECT wid FROM workflow_fields WHERE field = 'record')"

_FOLLOWING = f"""
DELETE FROM workflow_fields WHERE {_absent("workflow_row_follows")} AND {_UNRECORDED};
DELETE FROM workflow_done WHERE {_absent("workflow_row_follows")} AND {_UNRECORDED};
UPDATE workflow_fields SET expires_at = {FOLLOWS}
WHERE {_absent("workflow_row_follows")} AND field <> 'record' AND expires_at < {FOLLOWS};
CREATE TRIGGER IF NOT EXISTS workflow_row_follows AFTER INSERT ON workflow_fields
WHEN NEW.field <> 'record' AND NEW.expires_at < {FOLLOWS} AND {_RECORDED}
BEGIN
    UPDATE workflow_fields SET expires_at = {FOLLOWS} WHERE wid = NEW.wid AND field = NEW.field;
END;
CREATE TRIGGER IF NOT EXISTS workflow_row_follows_update AFTER UPDATE OF expires_at ON workflow_fields
WHEN NEW.field <> 'record' AND NEW.expires_at < {FOLLOWS} AND {_RECORDED}
BEGIN
    UPDATE workflow_fields SET expires_at = {FOLLOWS} WHERE wid = NEW.wid AND field = NEW.field;
END;
"""

#: When a record's workflow was created (its ``created_at``, Unix ms), or NULL when it does not say.
_CREATED_AT = """CASE WHEN json_valid(value) THEN
    CASE WHEN json_type(value, '$.created_at') = 'integer' THEN json_extract(value, '$.created_at') END
END"""

_RECORD = f"""
INSERT OR IGNORE INTO workflow_fields (wid, field, value, expires_at)
SELECT wid, 'ttl', MAX(expires_at - MIN({_NOW_MS}, IFNULL({_CREATED_AT}, {_NOW_MS})), 0), {FOLLOWS}
FROM workflow_fields
WHERE {_absent("workflow_record_ttl")} AND field = 'record' AND expires_at < {FOLLOWS};
CREATE TRIGGER IF NOT EXISTS workflow_record_ttl AFTER INSERT ON workflow_fields
WHEN NEW.field = 'record' AND NEW.expires_at < {FOLLOWS}
BEGIN
    INSERT OR IGNORE INTO workflow_fields (wid, field, value, expires_at)
    VALUES (NEW.wid, 'ttl', MAX(NEW.expires_at - {_NOW_MS}, 0), {FOLLOWS});
END;
CREATE TRIGGER IF NOT EXISTS workflow_record_expiry AFTER UPDATE OF expires_at ON workflow_fields
WHEN NEW.field = 'record' AND NEW.expires_at >= {FOLLOWS} AND OLD.expires_at < {FOLLOWS}
BEGIN
    UPDATE workflow_fields SET expires_at = MAX(OLD.expires_at, {_NOW_MS} + IFNULL(
        (SELECT CAST(value AS INTEGER) FROM workflow_fields WHERE wid = NEW.wid AND field = 'ttl'), 0))
    WHERE wid = NEW.wid AND field = 'record';
END;
CREATE TRIGGER IF NOT EXISTS workflow_record_deleted AFTER DELETE ON workflow_fields
WHEN OLD.field = 'record'
BEGIN
    DELETE FROM workflow_fields WHERE wid = OLD.wid;
    DELETE FROM workflow_done WHERE wid = OLD.wid;
END;
"""

#: The tables and the triggers, with the upgrade of a file that has the tables only.
SCHEMA = TABLES + _COUNTER + _FOLLOWING + _RECORD
