"""The reference pipeline actor in-process: its time limit, the paths a message may name, and
renditions written whole by concurrent jobs."""

from __future__ import annotations

import threading

import pytest
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
    assert written == {size: str(out / f"photo-{size}.jpg") for size in ("32", "16")}


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
