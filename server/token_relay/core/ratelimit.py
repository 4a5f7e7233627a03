"""A token bucket: at most ``rate`` events per second, in bursts of up to ``burst``."""

from __future__ import annotations

from .errors import ConfigError

__all__ = ["TokenBucket"]


class TokenBucket:
    """Pure: the caller passes the time."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ConfigError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float, count: int = 1) -> bool:
        """Spend ``count`` tokens if there are that many; otherwise spend none."""
        tokens = self.tokens + (now - self.stamp) * self.rate
        if tokens > self.burst:
            tokens = self.burst
        self.stamp = now
        if tokens < count:
            self.tokens = tokens
            return False
        self.tokens = tokens - count
        return True
