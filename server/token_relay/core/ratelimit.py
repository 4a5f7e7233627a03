"""A token bucket: at most ``rate`` events per second, in bursts of up to ``burst``; and
one bucket per key, in a map of bounded size."""

from __future__ import annotations

from collections import OrderedDict

from .errors import ConfigError

__all__ = ["KeyedBuckets", "TokenBucket"]


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


class KeyedBuckets:
    """A :class:`TokenBucket` per key (a client address), and one for all keys together,
    counting what each key was refused since its last success.

    At most ``max_keys`` keys are kept: a new key past that drops the least recently used
    one, with its count (a dropped key starts again with a full bucket). Pure: the caller
    passes the time.
    """

    __slots__ = ("_buckets", "burst", "max_keys", "overall", "rate")

    def __init__(
        self, rate: float, burst: float, overall: TokenBucket, max_keys: int, now: float
    ) -> None:
        TokenBucket(rate, burst, now)  # the same checks
        if max_keys < 1:
            raise ConfigError("max_keys must be at least 1")
        self.rate, self.burst, self.overall, self.max_keys = rate, burst, overall, max_keys
        self._buckets: OrderedDict[str, tuple[TokenBucket, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, now: float) -> int | None:
        """None if ``key`` (or everyone together) is over its rate; otherwise how many times
        it was refused since its last success (and that count starts again)."""
        found = self._buckets.pop(key, None)
        bucket, refused = found if found else (TokenBucket(self.rate, self.burst, now), 0)
        if bucket.take(now) and self.overall.take(now):
            self._buckets[key] = (bucket, 0)
            result: int | None = refused
        else:
            self._buckets[key] = (bucket, refused + 1)
            result = None
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return result
