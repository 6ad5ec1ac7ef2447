"""``python -m demo --short`` against the real services: its figures match what happened, and it
leaves no queue or state key behind, also when interrupted."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from demo.alive import dead_prefixes
from demo.main import EXIT_INTERRUPTED
from demo.run import SHORT
from demo.sweep import find_leftovers, sweep
from jobsystem.rabbitmq.broker import connection_urls
from jobsystem.settings import load_settings
from tests.queues import Queues, prefixed_topology
from tests.servers import smtp_server
from tests.support import ROOT, TEST_REDIS_URL, wait_for
from tests.workers import process_tree, running


def _demo(tmp_path: Path, *arguments: str, **overrides: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "STATE_URL": TEST_REDIS_URL, **overrides}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "demo",
            "--short",
            "--json-summary",
            str(tmp_path / "summary.json"),
            *arguments,
        ],
        cwd=ROOT,
        env=env,
        stdout=(tmp_path / "demo.out").open("wb"),
        stderr=subprocess.STDOUT,
    )


def _leftovers(prefix: str) -> tuple[list[str], list[bytes]]:
    """The queues and exchanges (by the management API) and the state keys under ``prefix``."""
    settings = Queues(prefix).settings
    names = [name for _, name in prefixed_topology(settings, prefix)]
    keys = list(redis.Redis.from_url(TEST_REDIS_URL).scan_iter(f"jobs:{prefix}*", count=1000))
    return names, keys


@pytest.fixture
def dead_demo(tmp_path: Path) -> Iterator[str]:
    """A queue and a state key under a demo prefix with no alive queue: a killed demo's leftovers
    (deleted after the test if the sweep it checks left them)."""
    import uuid

    import pika

    prefix = f"demo-{uuid.uuid4().hex[:6]}-"
    settings = load_settings({**os.environ, "STATE_URL": TEST_REDIS_URL})
    connection = pika.BlockingConnection(pika.URLParameters(connection_urls(settings)[0]))
    connection.channel().queue_declare(f"{prefix}emails", durable=True)
    connection.close()
    redis.Redis.from_url(TEST_REDIS_URL).set(f"jobs:{prefix}status:1", "x")
    yield prefix
    _clean_up_after(prefix, tmp_path)


def test_the_demo_reports_what_happened_and_leaves_nothing_behind(tmp_path, dead_demo):
    with smtp_server() as (port, received):
        demo = _demo(tmp_path, "--smtp-url", f"smtp://127.0.0.1:{port}")
        code = demo.wait(240)
        output = (tmp_path / "demo.out").read_text(errors="replace")
        assert code == 0, output
        summary = json.loads((tmp_path / "summary.json").read_text())

        mails = Counter(str(mail["To"]) for mail in received)
    campaign = {f"customer{i:04d}@example.com" for i in range(SHORT.recipients)}
    # Every mail the demo counts was delivered, once per recipient, duplicates included.
    assert summary["mails_sent"] == len(received) == SHORT.recipients + 3
    assert set(mails) == campaign | {"newcomer@example.com", "boss@example.com", "ops@example.com"}
    assert max(mails.values()) == 1
    assert summary["campaign_fanned_out"] == SHORT.recipients
    assert summary["deduplicated"] == 2 + SHORT.resent  # the welcome clicks and the re-sent slice
    # The failing syncs went to the dead letters, were replayed, and their status says so.
    assert summary["dead_lettered"] == summary["replayed"] == SHORT.partner_jobs
    assert summary["partner_syncs_ok"] == SHORT.partner_jobs
    assert summary["partner_calls_refused"] == SHORT.partner_jobs * 3  # 1 attempt + 2 retries each
    assert summary["run_per_queue"]["partner"] == SHORT.partner_jobs
    assert summary["run_per_queue"]["reports"] == 2
    assert summary["run_per_queue"]["emails"] == SHORT.recipients + 4  # with the fan-out job
    assert summary["rate_limited_waits"] > 0  # 43 mails through a bucket of 10
    [media] = summary["media"]
    assert media["state"] == "succeeded" and media["progress"] == 1.0
    assert len(media["result"]) == 4  # four renditions
    # Stopped cleanly, and nothing of its own left behind.
    assert summary["cleanup"]["worker_exit"] == 0 and summary["cleanup"]["scheduler_exit"] == 0
    cleanup = summary["cleanup"]
    assert cleanup["queues_deleted"] and cleanup["exchanges_deleted"] and cleanup["state_keys_deleted"] > 0
    assert _leftovers(summary["prefix"]) == ([], [])
    assert "Summary" in output and "jobctl dlq list" in output
    # A dead demo's leftovers went at its start (a demo test running beside it may sweep first).
    assert "error" not in summary["swept"]
    assert dead_demo not in summary["swept"]["demos"] or "dead demo(s)" in output
    assert _leftovers(dead_demo) == ([], [])


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "terminal-closed"])
def test_ctrl_c_or_a_closed_terminal_stops_the_demo_and_still_cleans_up(tmp_path, stop):
    every = Queues("")

    def demo_queue() -> str | None:
        """This demo's partner queue, once declared: its prefix read from its children's
        environment (the other case of this test may run a demo of its own beside it)."""
        prefixes = {_environment(pid).get("QUEUE_PREFIX") for pid in process_tree(demo.pid)}
        prefix = next((p for p in prefixes if p and p.startswith("demo-")), None)
        names = {q["name"] for q in requests.get(every.api(""), auth=every.auth, timeout=10).json()}
        return f"{prefix}partner" if prefix and f"{prefix}partner" in names else None

    demo = _demo(tmp_path)
    queue = wait_for(demo_queue, timeout=60, interval=0.2, what="the demo's queues")
    demo.send_signal(stop)  # in the middle of the workload
    # The demo gives each of its two children 30 s to stop and 10 s more once killed: 80 s at
    # worst on a loaded machine, then its clean-up.
    assert demo.wait(150) == EXIT_INTERRUPTED, (tmp_path / "demo.out").read_text(errors="replace")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["error"] == "interrupted"
    prefix = queue.removesuffix("partner")
    assert summary["prefix"] == prefix
    assert summary["cleanup"]["worker_exit"] is not None  # stopped, not left running
    assert _leftovers(prefix) == ([], [])


def _environment(pid: int) -> dict[str, str]:
    """A process's environment (empty once it is gone)."""
    with contextlib.suppress(OSError):
        variables = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        return dict(v.split("=", 1) for v in variables if "=" in v)
    return {}


def _clean_up_after(prefix: str, folder: Path) -> None:
    """What a demo killed with SIGKILL could not delete: its queues, exchanges, keys and folder."""
    from demo import services
    from jobsystem.settings import load_settings

    settings = load_settings({**os.environ, "QUEUE_PREFIX": prefix, "STATE_URL": TEST_REDIS_URL})
    services.delete_topology(settings, prefix, [])
    services.delete_state_keys(settings, prefix)
    if folder.name.startswith("jobs-demo-"):
        shutil.rmtree(folder, ignore_errors=True)


def test_a_demo_killed_with_sigkill_takes_its_worker_and_scheduler_down_with_it(tmp_path):
    """SIGKILL runs none of the demo's clean-up: its children (in sessions of their own) went on
    consuming its queues for ever. Each now gets SIGTERM from the kernel and stops, the worker
    with its worker processes; the next demo's sweep removes its queues, keys and folder."""
    demo = _demo(tmp_path, WORKER_PROCESSES="2")
    tree: list[int] = []
    env: dict[str, str] = {}

    def children_up() -> bool:
        """The worker's main process, its two worker processes (each ready), and the scheduler."""
        nonlocal tree, env
        tree = [pid for pid in process_tree(demo.pid) if running(pid)]
        env = next((e for e in map(_environment, tree) if "MEDIA_DIR" in e), {})
        log = Path(env["MEDIA_DIR"]).parent / "worker.log" if env else None
        ready = log is not None and log.exists() and log.read_text(errors="replace").count("ready for action")
        return len(tree) >= 4 and ready == 2

    try:
        wait_for(children_up, timeout=90, interval=0.1, what="the demo's worker and scheduler")
        prefix = env["QUEUE_PREFIX"]
        assert _leftovers(prefix)[0]  # its queues, and its alive queue among them
        demo.kill()
        assert demo.wait(10) == -signal.SIGKILL
        # dramatiq gives its worker processes WORKER_SHUTDOWN_TIMEOUT_MS (20 s in the demo) to
        # finish their jobs: 60 s leaves room for a loaded machine.
        wait_for(lambda: not any(map(running, tree)), timeout=60, interval=0.2, what="the children to exit")
        # The next demo's sweep: the killed demo's alive queue went with its connection and its
        # worker's consumers with the worker, so what it left is a dead demo's and goes (a demo
        # test running beside this one may sweep first).
        settings = load_settings({**os.environ, "STATE_URL": TEST_REDIS_URL})
        found = find_leftovers(settings)
        queues = {prefix: found[prefix].queues if prefix in found else []}
        assert dead_prefixes(connection_urls(settings)[0], queues) == [prefix]
        swept = sweep(settings, "", {prefix: found[prefix]} if prefix in found else {})
        assert swept.demos in ([prefix], [])
        assert _leftovers(prefix) == ([], [])
        assert not Path(env["MEDIA_DIR"]).parent.exists()  # its folder, the SQLite store's too
    finally:
        demo.kill()
        demo.wait(10)
        for pid in tree:
            if running(pid):  # the old code's orphans: they would consume the demo's queues for ever
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if env:
            _clean_up_after(env["QUEUE_PREFIX"], Path(env["MEDIA_DIR"]).parent)
    assert env and _leftovers(env["QUEUE_PREFIX"]) == ([], [])


#: ``python -m demo --short`` that stops where a SIGKILL may find it: its folder made, its worker
#: (which declares its queues) not started; it says ``stopped`` once there.
_STOPPED_BEFORE_ITS_QUEUES = """
import sys, time
from demo import main, services

def start_worker(*args, **kwargs):
    print("stopped", flush=True)
    time.sleep(120)

services.start_worker = start_worker
sys.exit(main.main(["--short"]))
"""


def test_a_demo_killed_before_declaring_its_queues_leaves_a_folder_the_next_sweep_removes(tmp_path):
    """Killed between making its folder and declaring its queues, a demo leaves only its folder:
    its alive queue went with its connection, no worker ran. No sweep ever removed it (a folder
    alone made no candidate). Its owners all gone, the next sweep removes it."""
    from demo.folders import FOLDER_NAME

    folders = tmp_path / "tmp"  # the demo's temporary directory
    folders.mkdir()
    env = {**os.environ, "STATE_URL": TEST_REDIS_URL, "TMPDIR": str(folders)}
    output = tmp_path / "demo.out"
    demo = subprocess.Popen(
        [sys.executable, "-c", _STOPPED_BEFORE_ITS_QUEUES],
        cwd=ROOT,
        env=env,
        stdout=output.open("wb"),
        stderr=subprocess.STDOUT,
    )
    prefix = ""
    try:
        wait_for(lambda: b"stopped" in output.read_bytes(), timeout=60, what="the demo's folder")
        [(folder, named)] = [(path, FOLDER_NAME.fullmatch(path.name)) for path in folders.iterdir()]
        assert named is not None, folder
        prefix = named.group(1)
        demo.kill()
        assert demo.wait(10) == -signal.SIGKILL
        wait_for(lambda: _leftovers(prefix) == ([], []), timeout=30, what="its alive queue to go")
        settings = load_settings({**os.environ, "STATE_URL": TEST_REDIS_URL})
        found = find_leftovers(settings, folders)

        swept = sweep(settings, "", {prefix: found[prefix]} if prefix in found else {})

        assert swept.demos == [prefix] and swept.folders == 1 and not folder.exists()
    finally:
        demo.kill()
        demo.wait(10)
        if prefix:
            _clean_up_after(prefix, tmp_path)


def test_a_connection_interrupted_mid_call_is_abandoned_not_reused(prefix):
    """Ctrl-C inside an AMQP call leaves the channel with a reply in flight: the demo's clean-up
    forgets that connection rather than calling on it (a close is a call), and the broker then
    opens a fresh one."""
    from demo.services import abandon_connection
    from jobsystem.system import get_system

    broker = get_system().broker
    abandon_connection(broker)  # whatever this process's earlier tests left open
    interrupted = broker.channel
    flush = interrupted._flush_output

    def ctrl_c(*waiters: object) -> None:
        interrupted._flush_output = flush
        raise KeyboardInterrupt

    interrupted._flush_output = ctrl_c
    queue = f"{prefix}interrupted"
    with contextlib.suppress(KeyboardInterrupt):
        broker.channel.queue_declare(queue, auto_delete=True)  # its reply is never read
    old = broker.connection
    abandon_connection(broker)
    assert broker.connection is not old and old not in broker.connections  # broker.close() skips it
    assert broker.channel.queue_declare(queue, auto_delete=True).method.queue == queue  # answered
    broker.channel.queue_delete(queue)
