"""The dynamic batcher: a batch leaves when it is full or when its oldest request has waited `max_wait_s`
since its arrival. It reads no clock itself (the caller passes `now`), so it is tested against a fake one."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int = 32
    max_wait_s: float = 0.002


class Batcher:
    def __init__(self, policy: BatchPolicy):
        self.policy = policy

    def take(self, pending: deque, now: float) -> list:
        """The requests that form the next batch now (oldest first), or [] to keep waiting. `pending` holds
        objects with an `arrival` time, in arrival order."""
        if not pending:
            return []
        p = self.policy
        if len(pending) < p.max_batch_size and now < self.deadline(pending):
            return []
        return [pending.popleft() for _ in range(min(p.max_batch_size, len(pending)))]

    def deadline(self, pending: deque) -> float:
        """When the oldest pending request's wait runs out (a batch leaves then, full or not)."""
        return pending[0].arrival + self.policy.max_wait_s
