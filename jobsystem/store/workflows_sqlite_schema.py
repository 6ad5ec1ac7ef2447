"""The SQLite workflow tables, and the triggers that keep them right whichever release writes.

``workflow_fields`` holds the fields a Redis hash would, one row each; ``workflow_done`` the
members counted, per step (a member's end is one ``INSERT OR IGNORE`` there, in every release).
Only the ``record`` row carries the workflow's expiry; every other row is written with
:data:`FOLLOWS` and lives as long as its workflow.

The trigger ``workflow_done_counted`` adds one to a step's field ``n:<step>`` for each member
counted there. It is the counter's only writer, so a finish costs the same whatever the step's
size, and a finish by a worker of an earlier release (which counted a step's rows with
``COUNT(*)`` and knows no counter) is counted too.

Applied to a file of an earlier release (the tables without the trigger), the schema first sets
every step's counter from its rows, once: the statements are idempotent, the upgrade step runs only
while the trigger does not exist yet, and all of them run in one ``BEGIN IMMEDIATE`` transaction
(:meth:`~jobsystem.store.sqlite.SqliteStore.ensure_schema`).
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

#: The tables and the triggers, with the upgrade of a file that has the tables only.
SCHEMA = TABLES + _COUNTER
