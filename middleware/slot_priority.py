"""The broker priority of a message deferred to a rate-limit slot: the queue's highest while it
holds the slot, its own again once the slot is honoured.

A deferred message comes back to the TAIL of its work queue a little before its slot
(``slot_lead_ms``); behind a backlog that takes longer than that to drain, it arrives after its
slot, the slot is void and the token it reserved is lost. Published with the queue's highest
priority, it is delivered before the backlog instead. The priority travels in the message's own
``broker_priority`` option, which the broker publishes as the AMQP priority on every hop (the delay
queue, the delay cascade, the move back to the work queue). The message's own priority is kept in
:data:`PRIORITY` and given back when it runs, so a later retry or a deferral without a slot is not
promoted. Plain queues (no ``x-max-priority``) have nothing to promote: see ``docs/architecture.md``
("Rate limits").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dramatiq.broker import MessageProxy

from jobsystem.runtime.message_shape import is_priority

__all__ = ["BROKER_PRIORITY", "PRIORITY", "SlotPriority"]

#: Dramatiq's option for the AMQP priority a message is published with.
BROKER_PRIORITY = "broker_priority"
#: Message option keeping the priority a message had before it was promoted for its slot (0 for
#: none: RabbitMQ delivers a message without a priority as priority 0).
PRIORITY = "rate_limit_priority"


class SlotPriority:
    """Options that promote a slot holder to ``top`` and give a message its own priority back.

    ``top``: the highest priority the work queues allow (``RABBITMQ_MAX_PRIORITY``); None or 0 for
    plain queues, where nothing is promoted.
    """

    def __init__(self, top: int | None) -> None:
        if top is not None and not is_priority(top):
            raise ValueError("the slot priority must be an integer from 0 to 255, or None")
        self.top = top or 0

    def promoted(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Options to merge into a copy deferred to a slot: the top priority, the own one kept
        (the one kept already if the message was promoted before)."""
        if not self.top:
            return self.restored(options)
        own = options.get(PRIORITY)
        if not is_priority(own):
            own = options.get(BROKER_PRIORITY)
            own = own if is_priority(own) else 0
        return {BROKER_PRIORITY: self.top, PRIORITY: own}

    @staticmethod
    def restored(options: Mapping[str, Any]) -> dict[str, Any]:
        """Options to merge into a copy that holds no slot: its own priority back (none if it had
        none), or nothing to change if it was not promoted."""
        own = options.get(PRIORITY)
        if not is_priority(own):
            return {}
        return {BROKER_PRIORITY: own or None, PRIORITY: None}

    def restore(self, message: MessageProxy) -> None:
        """Give a message about to run its own priority back, in place: a retry or any later
        re-enqueue copies its options."""
        for key, value in self.restored(message.options).items():
            if value is None:
                message.options.pop(key, None)
            else:
                message.options[key] = value
