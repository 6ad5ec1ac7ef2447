"""Idempotency keys registered at send whose messages are not published yet.

A send registers its key before the publish; should the publish fail, the key must be given back,
or the sender's next send of it is dropped as a duplicate of a message RabbitMQ never had.
:class:`UnpublishedKeys` remembers, per sending thread, the ``(key, message_id)`` pairs its last
send (or bulk send) registered, forgets each once its message is published, and gives back those
of the messages that were not in one store call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from dramatiq import Message

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.idempotency import IdempotencyBackend

__all__ = ["UnpublishedKeys"]

logger = logging.getLogger(__name__)


class UnpublishedKeys:
    """The keys this thread's last send registered, by message id, until published or given back.

    ``registered_option``: the message option marking a message whose key is registered; it is
    taken off a message whose key is given back, so that sending that message again registers it.
    """

    def __init__(self, backend: IdempotencyBackend, registered_option: str) -> None:
        self.backend = backend
        self.registered_option = registered_option
        self._local = threading.local()

    def _held(self) -> dict[str, str]:
        held: dict[str, str] | None = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = {}
        return held

    def hold(self, registered: Iterable[tuple[str, str]]) -> None:
        """Remember the ``(key, message_id)`` pairs a send just registered, in place of those of
        this thread's earlier send (published, or given back, by now)."""
        self._local.held = {message_id: key for key, message_id in registered}

    def published(self, message_id: str) -> None:
        """``message_id`` went out: its key stays registered."""
        self._held().pop(message_id, None)

    def give_back(self, messages: Iterable[Message[Any]]) -> None:
        """Unregister, in one store call, the keys held for ``messages``, which were not
        published. A store that does not answer is logged at ERROR: the keys then stay pending
        (a new send of them is dropped) until their TTL."""
        held = self._held()
        items = []
        for message in messages:
            key = held.pop(message.message_id, None)
            if key is not None:
                items.append((key, message.message_id))
                message.options.pop(self.registered_option, None)
        if not items:
            return
        key, message_id = items[0]
        fields = {"key": key, "message_id": message_id} if len(items) == 1 else {"keys": len(items)}
        try:
            self.backend.unregister_many(items)
        except StoreUnavailable as exc:
            log_outage(logger, logging.ERROR, "idempotency_unregister_failed", exc, **fields)
        else:
            logger.info("idempotency_unregistered", extra=fields)
