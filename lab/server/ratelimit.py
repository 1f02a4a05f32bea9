"""Token buckets for the per-principal and per-(principal, identity) rate limits (section 10).

Hand-written (a dozen lines) because the limiter runs before any backend work,
in process, on every acquire and renew; a library would add a dependency for
no gain. Limits are per server instance: N instances admit N times the rate.
"""

from __future__ import annotations

import time
from typing import Hashable


class TokenBuckets:
    """One token bucket per key: `rate` tokens/s, at most `burst` saved; bounded key count."""

    def __init__(self, rate: float, burst: int, max_keys: int = 100_000):
        self.rate = float(rate)
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, at)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, key: Hashable, now: float | None = None) -> float:
        """Take one token: 0.0 when allowed, else the seconds until one is available."""
        if not self.enabled:
            return 0.0
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate
        if key not in self._buckets and len(self._buckets) >= self.max_keys:
            self._evict(now)
        self._buckets[key] = (tokens - 1.0, now)
        return 0.0

    def _evict(self, now: float) -> None:
        """Forget buckets that have refilled completely (they behave like new ones), oldest first."""
        for key in list(self._buckets)[: max(1, self.max_keys // 10)]:
            tokens, at = self._buckets[key]
            if tokens + (now - at) * self.rate >= self.burst or len(self._buckets) >= self.max_keys:
                del self._buckets[key]
