"""Admission: how many generations (images, and video jobs) are accepted and not yet answered, the refusal
past ``max_queue`` (429 with a Retry-After derived from the recent completion rate)."""

from __future__ import annotations

import collections
import math
import threading
import time

from gfdit.serving.server.errors import APIError

RATE_WINDOW_S = 30.0  # the completion rate behind Retry-After is measured over this window
MAX_RETRY_AFTER_S = 60


class Admission:
    """Counts generations accepted and not yet answered; refuses past max_queue. Thread-safe."""

    def __init__(self, max_queue: int, retry_after_s: int = 1) -> None:
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self.pending = 0
        self._lock = threading.Lock()
        self._done: collections.deque[float] = collections.deque()  # monotonic times of recent answers

    def acquire(self, count: int) -> bool:
        with self._lock:
            if self.pending + count > self.max_queue:
                return False
            self.pending += count
            return True

    def release(self, count: int) -> None:
        with self._lock:
            self.pending -= count

    def admit(self, count: int) -> None:
        """Acquires ``count`` places or raises the 429 APIError."""
        if not self.acquire(count):
            raise APIError(
                429,
                f"the queue is full ({self.max_queue} generations outstanding); retry later",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": self.retry_after(count)},
            )

    def finished(self, count: int = 1) -> None:
        """Records ``count`` generations answered now (the completion rate that Retry-After is derived from)."""
        now = time.monotonic()
        with self._lock:
            self._done.extend([now] * count)
            self._forget(now)

    def completion_rate(self) -> float:
        """Generations answered per second over the last RATE_WINDOW_S seconds (0 before any)."""
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            if not self._done:
                return 0.0
            return len(self._done) / max(now - self._done[0], 1.0)

    def retry_after(self, count: int) -> str:
        """Seconds until ``count`` more generations likely fit: the time the recent completion rate needs to
        answer that many, at least retry_after_s and at most a minute."""
        rate = self.completion_rate()
        wait = count / rate if rate > 0 else self.retry_after_s
        return str(int(min(MAX_RETRY_AFTER_S, max(self.retry_after_s, math.ceil(wait)))))

    def _forget(self, now: float) -> None:
        while self._done and now - self._done[0] > RATE_WINDOW_S:
            self._done.popleft()
