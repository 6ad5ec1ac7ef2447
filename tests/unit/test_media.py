"""The reference pipeline actor in-process: its time limit, the paths a message may name, and
renditions written whole by concurrent jobs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import structlog.testing
from PIL import Image

from actors import media


def fails_at_once(exc: BaseException) -> bool:
    """Whether ``exc`` is one of ``make_renditions``' ``throws``: dead-lettered without a retry."""
    return isinstance(exc, media.make_renditions.options["throws"])


def test_the_time_limit_stays_below_the_consumer_timeout():
    assert media.make_renditions.options["time_limit"] < media.settings.rabbitmq_consumer_timeout_ms


@pytest.mark.parametrize(
    ("source", "output_dir"),
    [
        ("{tmp}/elsewhere/photo.png", None),
        ("../elsewhere/photo.png", None),
        ("uploads/link.png", None),  # a symbolic link inside, to a file outside
        ("uploads/photo.png", "{tmp}/elsewhere/out"),
        ("uploads/photo.png", "../elsewhere/out"),
    ],
)
def test_a_source_or_output_dir_outside_media_dir_is_refused(actor_settings, tmp_path, source, output_dir):
    actor_settings()
    (tmp_path / "media" / "uploads").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    Image.new("RGB", (64, 48)).save(tmp_path / "media" / "uploads" / "photo.png")
    Image.new("RGB", (64, 48)).save(tmp_path / "elsewhere" / "photo.png")
    (tmp_path / "media" / "uploads" / "link.png").symlink_to(tmp_path / "elsewhere" / "photo.png")
    with pytest.raises(Exception) as caught:
        media.make_renditions(
            source.format(tmp=tmp_path), sizes=[16], output_dir=output_dir and output_dir.format(tmp=tmp_path)
        )
    assert fails_at_once(caught.value), repr(caught.value)
    assert "MEDIA_DIR" in str(caught.value) and "elsewhere" not in str(caught.value)
    assert sorted(path.name for path in (tmp_path / "elsewhere").iterdir()) == ["photo.png"]


def test_paths_inside_media_dir_are_read_and_written(actor_settings, tmp_path):
    actor_settings()
    (tmp_path / "media" / "uploads").mkdir(parents=True)
    Image.new("RGB", (64, 48)).save(tmp_path / "media" / "uploads" / "photo.png")
    written = media.make_renditions("uploads/photo.png", sizes=[32, 16], output_dir="out")
    out = (tmp_path / "media" / "out").resolve()
    assert set(written) == {"32", "16"}
    for size, path in written.items():
        assert Path(path).parent == out and Path(path).name.endswith(f"-{size}.jpg")
        with Image.open(path) as image:
            assert max(image.size) == int(size)


def test_renditions_and_what_the_job_reports_carry_nothing_of_the_source_name(
    actor_settings, tmp_path, monkeypatch
):
    # The paths are the job's result (the state store, the dashboard, jobctl status): an upload's
    # name such as holiday-jane-doe.jpg was copied into every one of them.
    actor_settings()
    (tmp_path / "media" / "uploads").mkdir(parents=True)
    for name in ("holiday-jane-doe.png", "holiday-john-roe.png"):
        Image.new("RGB", (64, 48)).save(tmp_path / "media" / "uploads" / name)
    notes: list[str | None] = []

    def progress(value: float, note: str | None = None) -> bool:
        notes.append(note)
        return True

    monkeypatch.setattr(media, "progress", progress)
    with structlog.testing.capture_logs() as logged:
        jane = media.make_renditions("uploads/holiday-jane-doe.png", sizes=[32, 16], output_dir="out")
    john = media.make_renditions("uploads/holiday-john-roe.png", sizes=[32, 16], output_dir="out")
    reported = repr((jane, notes, logged))
    assert "jane" not in reported and "doe" not in reported and "holiday" not in reported, reported
    assert notes == ["decoding", "decoded 64x48", "32px written", "16px written"] * 2
    assert set(jane.values()).isdisjoint(john.values())  # two sources in one folder: their own files
    again = media.make_renditions("uploads/holiday-jane-doe.png", sizes=[32, 16], output_dir="out")
    assert again == jane  # a retried job writes the same files again
    out = (tmp_path / "media" / "out").resolve()
    assert all(Path(path).parent == out for path in (*jane.values(), *john.values()))


def test_an_unreadable_source_fails_at_once_without_naming_it(actor_settings, tmp_path):
    actor_settings()
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "maria-garcia.png").write_bytes(b"not an image")
    for source in ("maria-garcia.png", "missing-maria-garcia.png"):
        with pytest.raises(Exception) as caught:
            media.make_renditions(source)
        assert fails_at_once(caught.value) and "maria" not in str(caught.value), repr(caught.value)


def test_two_jobs_writing_one_rendition_at_once_both_succeed(tmp_path, monkeypatch):
    # Both write, then both move their file into place: a shared temporary name made the second
    # move fail with FileNotFoundError, which make_renditions dead-letters as a missing source.
    both_written = threading.Barrier(2, timeout=10)
    save = Image.Image.save

    def save_then_wait(image, *args, **kwargs):
        save(image, *args, **kwargs)
        both_written.wait()

    monkeypatch.setattr(Image.Image, "save", save_then_wait)
    target, errors = tmp_path / "photo-16.jpg", []

    def job() -> None:
        try:
            media._save(Image.new("RGB", (16, 16)), target)
        except Exception as exc:
            errors.append(exc)

    jobs = [threading.Thread(target=job) for _ in range(2)]
    for thread in jobs:
        thread.start()
    for thread in jobs:
        thread.join(20)
    assert errors == []
    assert [path.name for path in tmp_path.iterdir()] == ["photo-16.jpg"]
    with Image.open(target) as written:
        assert written.size == (16, 16)
