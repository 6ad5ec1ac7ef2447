"""What an email address the project sends with must look like: one bare ``local@domain``, no
display name, no space or line break. The sender (``MAIL_FROM``, checked at start-up) and each
recipient (checked by the ``send_email`` actor) alike."""

from __future__ import annotations

import re

__all__ = ["is_address"]

_ADDRESS = re.compile(r"[^@\s<>\"',;]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)+")


def is_address(text: str) -> bool:
    """Whether ``text`` is one such address, whole (a trailing line break included: it is not)."""
    return _ADDRESS.fullmatch(text) is not None
