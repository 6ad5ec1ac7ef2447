"""The state store in one SQLite file: the embedded default for a single host.

Safe across the worker processes of that host: WAL journal, ``BEGIN IMMEDIATE`` transactions, a
busy timeout. Features keep their own tables (:meth:`SqliteStore.ensure_schema`).
"""

from __future__ import annotations

import random
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jobsystem.store.base import Backends, Operations, StateStore, StoreMisconfigured, StoreUnavailable

__all__ = ["SqliteStore", "sqlite_error"]


#: SQLite errors that mean the file can never serve (wrong path, permissions, not a database).
_SQLITE_MISCONFIGURED = ("unable to open database", "not a database", "readonly database", "malformed")


def sqlite_error(exc: sqlite3.Error) -> StoreUnavailable:
    """The store error for anything sqlite3 raised (a busy lock or a full disk is unavailable)."""
    text = str(exc)
    kind = StoreMisconfigured if any(t in text for t in _SQLITE_MISCONFIGURED) else StoreUnavailable
    error = kind(f"sqlite: {type(exc).__name__}: {text}")
    error.__cause__ = exc  # says whether a retry can help (jobsystem.store.failures.transient)
    return error


_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    expires_at INTEGER
);
"""


class SqliteStore(StateStore):
    """The state store in one SQLite file, shared by the worker processes of one host."""

    kind = "sqlite"
    atomic_batch = True  # a batch is one transaction

    def __init__(self, path: str | Path, *, namespace: str = "jobs:", busy_timeout_ms: int = 10_000) -> None:
        self.path = Path(path)
        self.namespace = namespace
        self.label = f"sqlite:///{self.path}"
        self.busy_timeout_ms = busy_timeout_ms
        self.timeout = busy_timeout_ms / 1000
        self._local = threading.local()
        # Each open connection with the thread that opened it, and those close() asked their
        # thread to close: only that thread may, while it lives (see close()).
        self._connections: dict[sqlite3.Connection, threading.Thread] = {}
        self._retired: set[sqlite3.Connection] = set()
        self._lock = threading.Lock()
        # Tables are created on first use, not here: building a store touches no disk, and a file
        # that cannot be opened yet is an outage like any other, not a crash at import.
        self._schemas: list[str] = []
        self._applied: set[str] = set()
        self.ensure_schema(_SCHEMA)

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (SQLite connections must not cross threads), with every
        registered schema applied."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._retired and not conn.in_transaction:
            conn = self._unless_retired(conn)
        if conn is None:
            conn = self._opened()
        # Never inside an open transaction (a batch, while another thread registered a schema):
        # the schemas' BEGIN fails there and its ROLLBACK undid the batch. The next call applies them.
        if len(self._applied) < len(self._schemas) and not conn.in_transaction:
            self._apply_schemas(conn)
        return conn

    def _opened(self) -> sqlite3.Connection:
        """A new connection for this thread. Those of threads that ended are closed now: a thread
        that ends without :meth:`release_thread` (a dashboard request thread retired when idle, a
        timer's retry, a poller whose connection close() retired) left it open for good."""
        try:
            conn = self._open()
        except (sqlite3.Error, OSError) as exc:
            raise _as_store_error(exc) from exc
        self._local.conn = conn
        with self._lock:
            ended = self._take_ended()
            self._connections[conn] = threading.current_thread()
        for old in ended:
            old.close()  # its thread ended: no statement of its can be running
        return conn

    def _take_ended(self) -> list[sqlite3.Connection]:
        """The connections of threads that ended, taken out of the registry; the caller holds the
        lock and closes them.

        A thread not started through ``threading`` (one a C library starts and calls back from)
        is a ``threading._DummyThread``, which always looks alive (CPython 3.11): its connection
        is closed only by its own :meth:`release_thread`, and stays open otherwise. No thread of
        the product is one: Dramatiq, APScheduler, uvicorn and anyio, Sentry, prometheus-client
        and the project start theirs through ``threading``, and pika starts none."""
        ended = [conn for conn, owner in self._connections.items() if not owner.is_alive()]
        for conn in ended:
            del self._connections[conn]
            self._retired.discard(conn)
        return ended

    def _unless_retired(self, conn: sqlite3.Connection) -> sqlite3.Connection | None:
        """``conn``, or None once closed here if close() retired it while this thread used it."""
        with self._lock:
            if conn not in self._retired:
                return conn
            self._retired.discard(conn)
            self._connections.pop(conn, None)
        del self._local.conn
        conn.close()
        return None

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        # Switching a new file to WAL answers "database is locked" at once, without waiting, while
        # another process switches it too (two workers starting together): try again a while.
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    conn.close()
                    raise
                time.sleep(0.01 + random.random() * 0.05)
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def ensure_schema(self, ddl: str) -> None:
        """Register a feature's tables (``CREATE ... IF NOT EXISTS`` statements, triggers included);
        they are created once per process, before the first statement that could need them."""
        with self._lock:
            if ddl not in self._schemas:
                self._schemas.append(ddl)

    def _apply_schemas(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            pending = [ddl for ddl in self._schemas if ddl not in self._applied]
            if not pending:
                return
            try:
                conn.execute("BEGIN IMMEDIATE")
                for ddl in pending:
                    for statement in _statements(ddl):
                        _run_ddl(conn, statement)
                conn.execute("COMMIT")
            except BaseException as exc:  # an interrupt too: see transaction()
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise sqlite_error(exc) from exc
                raise
            self._applied.update(pending)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: ``BEGIN IMMEDIATE`` takes the write lock up front, so two
        processes never both read-then-write the same row.

        BEGIN and COMMIT are inside the ``try``: an exception another thread raises in this one (a
        time limit, a cancellation, a shutdown) is raised as a statement's call returns, so it can
        come right after BEGIN. Outside the ``try``, it left the transaction open for good: the
        write lock held from every other connection, and each later write of this thread joining
        it as a batch, never committed."""
        conn = self.connection()
        if conn.in_transaction:  # inside a batch: join it
            yield conn
            return
        with self.errors():
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # not if BEGIN failed, or SQLite rolled back itself
                    conn.execute("ROLLBACK")
                raise

    def operations(self, backends: Backends[Operations]) -> Operations:
        return backends.sqlite(self)

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Turn anything sqlite3 raises into a store error (see :func:`sqlite_error`)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise sqlite_error(exc) from exc

    def rows(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """The rows a read returns, on this thread's connection (inside its open transaction, if any)."""
        with self.errors():
            return self.connection().execute(sql, parameters).fetchall()

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def get(self, key: str) -> bytes | None:
        found = self.rows(
            "SELECT value FROM kv WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)",
            (self.key(key), self.now_ms()),
        )
        return _as_bytes(found[0][0]) if found else None

    def set(self, key: str, value: bytes | str, ttl_ms: int | None = None) -> None:
        expires = self.now_ms() + ttl_ms if ttl_ms is not None else None
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO kv (key, value, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
                (self.key(key), value, expires),
            )

    def delete(self, *keys: str) -> None:
        if keys:
            with self.transaction() as conn:
                conn.executemany("DELETE FROM kv WHERE key = ?", [(self.key(k),) for k in keys])

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        """Expiries are wall times: a holder's lease seen ending more than the holder's own TTL
        from now was renewed before the clock went back, and is cut to that TTL from now, so a dead
        holder blocks a take-over one TTL after the jump is seen, not for the jump's size.

        The holder's TTL is recorded beside the lease (:func:`_ttl_key`), not taken from the
        asker: processes may disagree on it while ``SCHEDULER_LEASE_MS`` changes in a rolling
        deploy, and a standby with a shorter TTL cut a live holder's lease to its own and took it.
        A lease of a holder on the previous release (no record, or one another holder left) is
        judged by the asker's TTL, as then; the previous release never reads the record."""
        now = self.now_ms()
        with self.transaction() as conn:
            row = conn.execute(
                "SELECT value, expires_at FROM kv WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)",
                (self.key(name), now),
            ).fetchone()
            if row is not None and _as_bytes(row[0]).decode() != owner:
                holder_ttl = _recorded_ttl(conn, self.key(_ttl_key(name)), _as_bytes(row[0]).decode(), now)
                cut = now + (ttl_ms if holder_ttl is None else holder_ttl)
                if row[1] is not None and row[1] > cut:
                    conn.execute(
                        "UPDATE kv SET expires_at = ? WHERE key IN (?, ?)",
                        (cut, self.key(name), self.key(_ttl_key(name))),
                    )
                return False
            upsert = (
                "INSERT INTO kv (key, value, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at"
            )
            conn.execute(upsert, (self.key(name), owner, now + ttl_ms))
            conn.execute(upsert, (self.key(_ttl_key(name)), f"{ttl_ms} {owner}", now + ttl_ms))
            return True

    def release_lease(self, name: str, owner: str) -> bool:
        with self.transaction() as conn:
            cursor = conn.execute(
                "DELETE FROM kv WHERE key = ? AND value = ? AND expires_at > ?",
                (self.key(name), owner, self.now_ms()),
            )
            if cursor.rowcount == 0:
                return False  # not the holder's: its record stays
            conn.execute("DELETE FROM kv WHERE key = ?", (self.key(_ttl_key(name)),))
            return True

    def lease_holder(self, name: str) -> str | None:
        value = self.get(name)
        return value.decode() if value is not None else None

    @contextmanager
    def batch(self) -> Iterator[StateStore]:
        with self.transaction():
            yield self

    def purge_expired(self) -> int:
        """Delete expired rows (reads ignore them already; this reclaims the space)."""
        with self.transaction() as conn:
            return conn.execute("DELETE FROM kv WHERE expires_at <= ?", (self.now_ms(),)).rowcount

    def ping(self) -> None:
        self.rows("SELECT 1")

    def release_thread(self) -> None:
        """Close the calling thread's connection as it is about to end (a health lane that idled
        out); otherwise it stays open until another thread opens one, or :meth:`close`."""
        conn: sqlite3.Connection | None = self._local.__dict__.pop("conn", None)
        if conn is None:
            return
        with self._lock:
            self._connections.pop(conn, None)
            self._retired.discard(conn)
        conn.close()

    def close(self) -> None:
        """Close the calling thread's connection and those of threads that ended; retire the
        others, which their own thread closes at its next call (outside a transaction). Closing a
        connection another thread is using crashes the interpreter (CPython 3.11 frees the handle
        under the running statement), and a process's pollers may be mid-statement as it closes."""
        current = threading.current_thread()
        with self._lock:
            for conn in self._take_ended():
                conn.close()
            for conn, owner in list(self._connections.items()):
                if owner is current:
                    del self._connections[conn]
                    self._retired.discard(conn)
                    conn.close()
                else:
                    self._retired.add(conn)
        self._local.__dict__.pop("conn", None)


def _statements(ddl: str) -> Iterator[str]:
    """The statements of ``ddl`` one by one: split at the semicolons that end a statement, not at
    those inside one (a trigger's body)."""
    pending = ""
    for piece in ddl.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n\t;"):
                yield pending
            pending = ""
    if pending.strip(" \n\t;"):
        yield pending


_ADD_COLUMN = re.compile(r"\s*ALTER TABLE (\w+) ADD COLUMN (\w+)", re.IGNORECASE)


def _run_ddl(conn: sqlite3.Connection, statement: str) -> None:
    """One schema statement; ``ALTER TABLE t ADD COLUMN c`` only where ``t`` lacks ``c`` (SQLite
    has no ``IF NOT EXISTS`` for a column: a table an earlier release made gains it once, under
    the write lock, so two processes never both add it)."""
    added = _ADD_COLUMN.match(statement)
    if added and added[2] in {row[1] for row in conn.execute(f"PRAGMA table_info({added[1]})")}:
        return
    conn.execute(statement)


def _as_store_error(exc: sqlite3.Error | OSError) -> StoreUnavailable:
    """A file that cannot be created (a missing or read-only folder) is misconfigured."""
    if isinstance(exc, sqlite3.Error):
        return sqlite_error(exc)
    return StoreMisconfigured(f"sqlite: {type(exc).__name__}: {exc.strerror or exc}")


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _ttl_key(name: str) -> str:
    """The key of the TTL lease ``name``'s holder took it with: a row of its own, so the lease's
    row stays what the previous release reads and writes (its value the holder alone)."""
    return f"{name}:lease-ttl"


def _recorded_ttl(conn: sqlite3.Connection, key: str, holder: str, now: int) -> int | None:
    """The TTL ``holder`` recorded at ``key``, or None: no record (a lease of the previous
    release), or one of another holder (one of that release took the lease over since)."""
    row = conn.execute(
        "SELECT value FROM kv WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)", (key, now)
    ).fetchone()
    if row is None:
        return None
    ttl, _, recorded_by = _as_bytes(row[0]).decode().partition(" ")
    return int(ttl) if recorded_by == holder and ttl.isdigit() else None
