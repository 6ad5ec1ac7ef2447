"""An actor's return value as the JSON text the state store keeps, or None when it is not kept.

Idempotency (the key's result), Status (the record's) and Workflows (a member's, piped to the
next step) keep it, each with its own size limit. Any value may come back from an actor: one
``json.dumps`` cannot encode (``TypeError``, ``ValueError``) or that is nested too deep for it
(``RecursionError``) is not kept, rather than failing the hook that records the job's end.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["result_json", "why_not_kept"]


def result_json(result: Any, max_bytes: int) -> str | None:
    """``result`` as JSON text when it encodes within ``max_bytes`` characters, else None."""
    try:
        encoded = json.dumps(result)
    except Exception:
        return None
    return encoded if len(encoded) <= max_bytes else None


def why_not_kept(result: Any, max_bytes: int) -> str:
    """Why :func:`result_json` keeps no JSON of ``result``, in words free of its value (they are
    shown by ``jobctl status``): its size against the limit, or the encoder's error type."""
    try:
        encoded = json.dumps(result)
    except Exception as exc:
        return f"result not JSON-encodable ({type(exc).__name__})"
    return f"result too large: {len(encoded)} bytes > {max_bytes}"
