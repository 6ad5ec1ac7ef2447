"""The reference pipeline actor: image renditions with progress per stage, polled like an application."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from actors import media
from jobsystem.store import open_store
from jobsystem.store.status import status_backend
from tests.support import TEST_REDIS_URL, wait_for


def test_renditions_report_progress_per_stage_and_the_application_polls_them(
    start_worker, queues, prefix, tmp_path
):
    # Inside the worker's MEDIA_DIR, named as users name their uploads: nothing of the name may
    # reach the result the store keeps (the dashboard and jobctl status show it).
    source = tmp_path / "media" / "uploads" / "holiday-jane-doe.png"
    source.parent.mkdir(parents=True)
    Image.effect_mandelbrot((2400, 1600), (-2.0, -1.2, 1.0, 1.2), 100).save(source)
    read = status_backend(open_store(TEST_REDIS_URL, namespace=f"jobs:{prefix}")).get
    start_worker()
    sent = queues.send(
        media.make_renditions, str(source), sizes=[1280, 640, 160], output_dir=str(tmp_path / "media" / "out")
    )

    # What an application's status endpoint does: poll until the job is finished.
    seen: list[float] = []

    def poll():
        record = read(sent.message_id)
        if record is not None and record.progress is not None and record.progress not in seen:
            seen.append(record.progress)
        return record if record is not None and record.finished else None

    done = wait_for(poll, timeout=60, interval=0.01, what="the renditions")
    assert done.state == "succeeded" and done.note == "160px written" and done.progress == 1.0
    assert set(done.result) == {"1280", "640", "160"}
    assert "jane" not in repr(done.to_dict()), done.to_dict()
    for size, path in done.result.items():
        assert Path(path).parent == (tmp_path / "media" / "out").resolve()
        with Image.open(path) as image:
            assert max(image.size) == int(size) and image.format == "JPEG"
    # Progress only moves forward, in the stages' steps (decode, then one per size).
    assert seen == sorted(seen) and set(seen) <= {0.0, 0.25, 0.5, 0.75, 1.0}
