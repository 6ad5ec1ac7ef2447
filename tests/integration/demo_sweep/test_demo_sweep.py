"""The sweep a demo runs as it starts, against the real RabbitMQ and Redis: a dead demo's queues,
delay-cascade exchanges, state keys and folder go; a live demo's (its alive queue held by another
connection, or gone while its connection is down but its worker consuming, or back within the
second look, or its folder held), the sweeping demo's own and every name outside ``demo-xxxxxx-``
stay, and so does a live folder whose prefix has nothing on this vhost (a demo of this host on
another RabbitMQ); a folder whose owners are all gone goes whatever its demo left, and state keys
no sweep here can judge get an expiry instead of staying for good.

The tests sweep only the prefixes they made (``sweep`` on their part of ``find_leftovers``): the
vhost is shared, and a demo of an older release running beside them has no alive queue."""

from __future__ import annotations

import uuid

import pytest
import redis

from demo.alive import alive_queue
from demo.folders import folder_for, vhost_of
from demo.sweep import Leftovers, find_leftovers, sweep
from jobsystem.rabbitmq.delays import DelayCascade
from tests.integration.demo_sweep.leftovers import (
    _A_DAY,
    _OTHER_VHOST,
    _WORK_QUEUES,
    _age,
    _demo_prefix,
    _old_folder,
)


def test_a_dead_demos_leftovers_go_and_a_live_ones_stay(settings, made, channel):
    dead, keys_only, live, own = (_demo_prefix() for _ in range(4))
    folders = {
        dead: made.demo(dead),  # killed with SIGKILL (or a release without alive queues): none
        keys_only: made.demo(keys_only, queues=False),  # killed halfway through its clean-up
        live: made.demo(live, owner="live"),
        own: made.demo(own, owner="live"),  # the sweeping demo's own prefix is never swept
    }
    channel.queue_declare(alive_queue(live), exclusive=True)  # held: the demo runs
    found = find_leftovers(settings, made.folders)
    assert {dead, keys_only, live, own} <= set(found)
    assert set(found[dead].queues) >= {dead + q for q in _WORK_QUEUES} | set(DelayCascade(dead).queues())
    assert set(found[dead].exchanges) == set(DelayCascade(dead).exchanges())
    assert {p: found[p].folders for p in folders} == {p: [folder] for p, folder in folders.items()}
    live_before, own_before = made.under(live), made.under(own)

    swept = sweep(settings, own, {p: found[p] for p in (dead, keys_only, live, own)})

    assert sorted(swept.demos) == sorted([dead, keys_only])
    assert swept.queues == len(_WORK_QUEUES) + len(DelayCascade(dead).queues()) + 1  # and unroutable
    assert swept.exchanges == len(DelayCascade(dead).exchanges())
    assert (swept.state_keys, swept.folders) == (4, 2)
    assert "2 folders" in swept.line()
    assert made.under(dead) == made.under(keys_only) == ([], [], [])
    assert not folders[dead].exists() and not folders[keys_only].exists()
    assert made.under(live) == live_before and alive_queue(live) in live_before[0]
    assert made.under(own) == own_before
    assert (folders[live] / "state.db").exists() and (folders[own] / "state.db").exists()


def test_only_a_dead_demos_own_folders_go(settings, made, tmp_path):
    """A folder goes with its prefix judged dead, and only a directory of its own name: a folder
    whose prefix has nothing on this vhost (its demo may be live on another RabbitMQ: held, or of
    the release before the lock), names that only look alike, an older release's ``jobs-demo-``
    folder and a link stay."""
    dead, elsewhere, elsewhere_old = _demo_prefix(), _demo_prefix(), _demo_prefix()
    folder = made.demo(dead)
    old = _old_folder(dead, tmp_path, vhost_of(settings.rabbitmq_url))  # goes with its prefix
    alone = made.demo(elsewhere, queues=False, keys=False, vhost=_OTHER_VHOST, owner="live")
    alone_old = _old_folder(elsewhere_old, tmp_path, _OTHER_VHOST)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"x")
    tail = folder.name.removeprefix(f"jobs-{dead}")
    kept = [
        tmp_path / f"jobs-{dead}{tail}x",  # too long
        tmp_path / f"jobs-{dead}{tail[:-1]}",  # too short
        tmp_path / f"jobs-{dead.upper()}{tail}",
        tmp_path / f"xjobs-{dead}{tail}",
        tmp_path / "jobs-demo-k3x9_q0z",  # an older release's (mkdtemp's) name: no prefix in it
    ]
    for path in kept:
        path.mkdir()
    link = folder_for(dead, tmp_path)
    link.symlink_to(outside, target_is_directory=True)
    found = find_leftovers(settings, tmp_path)
    assert sorted(found[dead].folders) == sorted([folder, old])
    assert found[elsewhere].folders == [alone] and found[elsewhere_old].folders == [alone_old]

    swept = sweep(settings, "", {p: found[p] for p in (dead, elsewhere, elsewhere_old)})

    assert swept.demos == [dead] and swept.folders == 2 and not folder.exists() and not old.exists()
    assert (alone / "state.db").exists() and alone_old.is_dir()
    assert all(path.is_dir() for path in kept) and link.is_symlink() and (outside / "keep").exists()


def test_a_folder_whose_owners_are_all_gone_goes_whatever_its_demo_left(settings, made, tmp_path):
    """A demo killed after making its folder but before declaring its queues left nothing else:
    its alive queue went with its connection, its worker never started. No sweep removed its
    folder. Its lock free, it goes now, also one marked with another vhost (that demo is dead
    too) or left unmarked by a demo killed between its ``mkdir`` and its lock; a held one, or an
    unmarked one made an instant ago (perhaps before its lock), stays."""
    here, there, unmarked, live, fresh = (_demo_prefix() for _ in range(5))
    gone = [
        made.demo(here, queues=False, keys=False),
        made.demo(there, queues=False, keys=False, vhost=_OTHER_VHOST),
    ]
    gone.append(folder_for(unmarked, tmp_path))
    gone[-1].mkdir(mode=0o700)
    _age(gone[-1])
    kept = [made.demo(live, queues=False, keys=False, owner="live"), folder_for(fresh, tmp_path)]
    kept[-1].mkdir(mode=0o700)
    mine = (here, there, unmarked, live, fresh)
    found = find_leftovers(settings, tmp_path)

    swept = sweep(settings, "", {prefix: found[prefix] for prefix in mine})

    assert sorted(swept.demos) == sorted([here, there, unmarked]) and swept.folders == 3
    assert not [folder for folder in gone if folder.exists()]
    assert all(folder.is_dir() for folder in kept) and (kept[0] / "state.db").exists()


def test_a_held_folder_keeps_its_demo_whatever_rabbitmq_says(settings, made):
    """A live demo's alive queue is gone while its connection is down, and its queues have no
    consumer before its worker started (or once it stopped): RabbitMQ alone would take it for dead
    after the second look. Its folder's lock says it runs: nothing of it goes."""
    live, dead = _demo_prefix(), _demo_prefix()
    folder = made.demo(live, owner="live")
    made.demo(dead)
    found = find_leftovers(settings, made.folders)
    live_before = made.under(live)

    swept = sweep(settings, "", {prefix: found[prefix] for prefix in (live, dead)})

    assert swept.demos == [dead] and made.under(dead) == ([], [], [])
    assert made.under(live) == live_before and (folder / "state.db").exists()


def test_a_live_demo_on_another_vhost_sharing_the_redis_is_no_candidate(settings, made):
    """A demo of this host runs on another vhost (or RabbitMQ) with the same Redis: this sweep sees
    its state keys and its folder, nothing of it on this vhost, which is all a live demo there
    leaves here. Judged on this vhost it would look dead: its folder (reports, media, schedules)
    and its keys would go while it runs. Its folder's mark names its vhost: no candidate. Keys
    alone, without a folder marked with this vhost, make none either. (Its folder held, its demo
    is taken for live whatever its mark says; the release before the lock's is judged by the mark.)"""
    elsewhere, elsewhere_old, keys_only = _demo_prefix(), _demo_prefix(), _demo_prefix()
    folders = [
        made.demo(elsewhere, queues=False, vhost=_OTHER_VHOST, owner="live"),
        made.demo(elsewhere_old, queues=False, vhost=_OTHER_VHOST, owner="old"),
    ]
    for folder in folders:
        (folder / "reports").mkdir()
    made.demo(keys_only, queues=False).rename(made.folders / "not-a-demo-folder")
    mine = (elsewhere, elsewhere_old, keys_only)
    before = [made.under(prefix) for prefix in mine]
    found = find_leftovers(settings, made.folders)  # what a demo's sweep judges and deletes

    swept = sweep(settings, "", {prefix: found[prefix] for prefix in mine})

    assert swept.demos == [] and swept.leftovers == 0
    assert all((folder / "reports").is_dir() for folder in folders)
    assert [made.under(prefix) for prefix in mine] == before and all(keys for _, _, keys in before)


def test_state_keys_no_sweep_can_judge_are_given_an_expiry_not_deleted(settings, made, client):
    """The per-queue status counters, the dead-letter index and the worker records have no expiry
    of their own: the keys of a demo whose folder went first (its clean-up stopped halfway, /tmp
    cleaned), or of a demo of another vhost that died, stayed for good, no sweep here able to
    judge them. They get an expiry of a day, nothing deleted: a shorter one of their own is kept,
    and a live demo's (its folder held) get none."""
    no_folder, elsewhere_old, live = _demo_prefix(), _demo_prefix(), _demo_prefix()
    made.demo(no_folder, queues=False).rename(made.folders / "not-a-demo-folder")
    made.demo(elsewhere_old, queues=False, vhost=_OTHER_VHOST, owner="old")
    made.demo(live, queues=False, vhost=_OTHER_VHOST, owner="live")
    client.set(f"jobs:{no_folder}lease", "x", px=60_000)
    mine = (no_folder, elsewhere_old, live)
    before = [made.under(prefix) for prefix in mine]
    found = find_leftovers(settings, made.folders)

    swept = sweep(settings, "", {prefix: found[prefix] for prefix in mine if prefix in found})

    assert [made.under(prefix) for prefix in mine] == before
    expiring = [key for prefix in (no_folder, elsewhere_old) for key in made.under(prefix)[2]]
    ttls = {key: client.ttl(key) for key in expiring}
    assert len(ttls) == 5 and all(0 < ttl <= _A_DAY for ttl in ttls.values()), ttls
    assert ttls[f"jobs:{no_folder}lease".encode()] <= 60
    assert all(ttl > 60 for key, ttl in ttls.items() if not key.endswith(b"lease"))
    assert [client.ttl(key) for key in made.under(live)[2]] == [-1, -1]
    assert swept.keys_expiring == 4 and "4 state keys" in swept.line() and swept.leftovers == 0


def test_a_sweep_stopped_before_the_keys_went_leaves_what_judges_them(settings, made, monkeypatch):
    """A sweep removed a dead demo's folder, then its keys: stopped in between (killed, Redis
    down), it left keys that no later sweep could judge (nothing of them on this vhost, no folder
    marked with it). The keys go first now: the folder stays for the next sweep, which ends it."""
    import jobsystem.store.redis

    dead = _demo_prefix()
    folder = made.demo(dead, queues=False)

    def redis_down(*args: object) -> int:
        raise redis.ConnectionError("Redis down")

    monkeypatch.setattr(jobsystem.store.redis, "delete_matching", redis_down)
    found = find_leftovers(settings, made.folders)
    with pytest.raises(redis.ConnectionError):
        sweep(settings, "", {dead: found[dead]})
    assert folder.is_dir() and made.under(dead)[2]
    monkeypatch.undo()

    found = find_leftovers(settings, made.folders)
    swept = sweep(settings, "", {dead: found[dead]})

    assert swept.demos == [dead] and made.under(dead) == ([], [], []) and not folder.exists()


def test_names_outside_the_demo_prefix_are_never_candidates(settings, made):
    tail = uuid.uuid4().hex[:6]
    lookalikes = [f"demox-{tail}-q", f"mine-demo-{tail}-q", f"demo-{tail}x-q", f"demo-{tail.upper()}z-q"]
    for name in lookalikes:
        made.other(name)
    found = find_leftovers(settings)
    assert not [p for p in found if tail in p or tail.upper() in p]
    # Handed to the sweep anyway, as if found: refused, they are no demo's prefix.
    swept = sweep(settings, "", {name: Leftovers(queues=[name]) for name in lookalikes})
    assert swept.demos == []
    for name in lookalikes:
        assert made.under(name) == ([name], [], [f"jobs:{name}".encode()])
