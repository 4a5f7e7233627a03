"""Which channels' messages the webhooks take (``--webhook-channel``)."""

from __future__ import annotations

from collections.abc import Callable

from ..core.grants import Grant, Role
from ..core.settings import Settings

__all__ = ["webhook_filter"]


def webhook_filter(settings: Settings) -> Callable[[str], bool]:
    """Whether a channel's messages go to the webhooks: by the grant rules (a name, or a
    prefix ending in ``*``); every channel when no ``--webhook-channel`` is given."""
    if not settings.webhooks:
        return lambda channel: False
    if not settings.webhook_channels:
        return lambda channel: True
    return Grant(Role.SUBSCRIBE, settings.webhook_channels).allows
