"""Dramatiq's Pipelines, without its cost for the jobs that are not part of a pipeline.

Dramatiq's ``Pipelines.after_process_message`` imports ``dramatiq.message`` on every call (to
avoid an import cycle) and looks the actor up before it reads the message's ``pipe_target``: about
1 µs a job. A message without a ``pipe_target`` option is in no pipeline and nothing happens to it
there; :class:`QuickPipelines` sees that first and leaves such a message alone, and hands the
others to Dramatiq's hook. (``jobsystem.dramatiq_contract.check_contract`` checks that the hook
still reads ``pipe_target`` from the message's options.)
"""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Pipelines

__all__ = ["QuickPipelines"]


class QuickPipelines(Pipelines):
    """:class:`dramatiq.middleware.Pipelines`, which returns at once for a message in no pipeline."""

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if message.options.get("pipe_target") is None:
            return
        super().after_process_message(broker, message, result=result, exception=exception)  # type: ignore[no-untyped-call]
