"""Media renditions: the reference long, multi-stage job that reports its progress.

The pattern to copy for "the user stares at a spinner": split the work into stages, call
:func:`~middleware.status.progress` at each, and let the application poll
``actors.status.get_status(message_id)`` (see the README). Outputs are written atomically, each
through a temporary file of its own, so a redelivered or retried job, or two jobs on one source,
simply write them again. The source and the output folder must lie inside ``MEDIA_DIR``.
Renditions are named after a keyed hash of the source's path, never its name: an upload's name
may carry personal data (``holiday-jane-doe.jpg``), and the paths become the job's result, kept
in the state store and shown by the dashboard and ``jobctl status``.

Long jobs need two limits to agree: the actor's ``time_limit`` (Dramatiq interrupts the actor
past it) must stay below RabbitMQ's ``consumer_timeout`` (``RABBITMQ_CONSUMER_TIMEOUT_MS``): a
delivery unacked for longer makes RabbitMQ close the worker's channel, and the message is
redelivered to run again while the first run may still be going.
"""

from __future__ import annotations

from pathlib import Path

import dramatiq
from dramatiq.middleware import CurrentMessage
from PIL import Image, ImageOps, UnidentifiedImageError

from actors.files import OutsideDirectory, inside, replacing
from jobsystem.observability.logs import get_logger
from jobsystem.system import get_system
from middleware.status import progress

logger = get_logger(__name__)
settings = get_system().settings
#: The store keys' hasher (``STATE_KEY_SECRET``): names a source's renditions without its name.
key_hasher = get_system().key_hasher

#: Longest edge of each rendition, in pixels (never larger than the source).
SIZES = (1920, 1280, 640, 160)

#: 25 minutes, and always below RabbitMQ's consumer_timeout (see the module docstring).
TIME_LIMIT_MS = min(25 * 60_000, settings.longest_time_limit_ms)


def _save(image: Image.Image, path: Path) -> None:
    """Write ``image`` as JPEG atomically: a reader never sees a half-written file."""
    rgb = image if image.mode in ("RGB", "L") else image.convert("RGB")
    with replacing(path) as handle:
        rgb.save(handle, format="JPEG", quality=85, optimize=True)


def rendition_name(source: Path, size: int) -> str:
    """The file name of ``source``'s rendition at ``size``: the same for every job on that source
    (a retried job writes its files again), with nothing of the source's name in it."""
    relative = source.relative_to(settings.media_dir.resolve())  # the same path on every worker
    return f"{key_hasher(f'rendition:{relative.as_posix()}')}-{size}.jpg"


def _decode(path: Path) -> Image.Image:
    """The image at ``path``, turned upright; its errors do not name the path (the message's)."""
    try:
        with Image.open(path) as opened:
            image = ImageOps.exif_transpose(opened)
            image.load()
    except FileNotFoundError:
        raise FileNotFoundError("source does not exist") from None
    except UnidentifiedImageError:
        raise UnidentifiedImageError("source is not an image Pillow can read") from None
    return image


@dramatiq.actor(
    queue_name=settings.queue("media"),
    time_limit=TIME_LIMIT_MS,
    throws=(UnidentifiedImageError, FileNotFoundError, OutsideDirectory),
)
def make_renditions(
    source: str, sizes: list[int] | None = None, output_dir: str | None = None
) -> dict[str, str]:
    """Resize the image at ``source`` to each of ``sizes`` (longest edge); returns {size: path},
    each path ``<output_dir>/<hash>-<size>.jpg`` (:func:`rendition_name`).

    ``source`` and ``output_dir`` (default: a folder named after the job) are paths inside
    ``MEDIA_DIR``, absolute or relative to it. Stages: decode, then one per size, each reported as
    progress. An unreadable or missing source, or a path outside ``MEDIA_DIR``, fails at once
    (``throws``): retrying would not help.
    """
    targets = sorted({int(s) for s in (sizes or SIZES)}, reverse=True)
    stages = len(targets) + 1
    message = CurrentMessage.get_current_message()
    job = message.message_id if message is not None else "local"
    image_path = inside(settings.media_dir, source, what="source", setting="MEDIA_DIR")
    out = inside(settings.media_dir, output_dir or job, what="output_dir", setting="MEDIA_DIR")
    out.mkdir(parents=True, exist_ok=True)

    progress(0.0, note="decoding")
    image = _decode(image_path)
    progress(1 / stages, note=f"decoded {image.width}x{image.height}")

    renditions: dict[str, str] = {}
    for done, size in enumerate(targets, start=2):
        rendition = image.copy()
        rendition.thumbnail((size, size), Image.Resampling.LANCZOS)
        path = out / rendition_name(image_path, size)
        _save(rendition, path)
        renditions[str(size)] = str(path)
        progress(done / stages, note=f"{size}px written")
    logger.info("renditions_written", sizes=targets, source_size=[image.width, image.height])
    return renditions
