"""Idempotent producers of a durable stream: ``Producer-Id``, ``-Epoch`` and ``-Seq`` fenced.

Each producer id has an epoch and the last sequence number it wrote in that epoch. A request
is judged before anything is appended (:meth:`Producers.judge`) and recorded once it is
(:meth:`Producers.record`):

* an epoch below the producer's is stale: 403, with the current epoch;
* a higher epoch starts a new session, at seq 0 only (400 otherwise);
* in the same epoch, a seq at or below the last one is a duplicate (204, nothing appended),
  the next one is new data, and one past it is a gap: 409, with the seq expected.

The state is bounded: at most ``limit`` producers per stream; one more forgets the one that
wrote least recently (it is then treated as new, as after the protocol's state expiry).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from .errors import StreamRefused

__all__ = ["MAX_PRODUCER_NUMBER", "Producer", "Producers", "Verdict"]

MAX_PRODUCER_NUMBER = 2**53 - 1
"""The largest epoch or seq (JavaScript's largest exact integer)."""


@dataclass(frozen=True, slots=True)
class Producer:
    """A request's producer headers, parsed."""

    id: str
    epoch: int
    seq: int


class Verdict(Enum):
    """What a producer's request is."""

    NEW = "new"
    """New data: append it, then :meth:`Producers.record` it."""
    DUPLICATE = "duplicate"
    """Already appended: answer 204 and append nothing."""


@dataclass(slots=True)
class _State:
    epoch: int
    last_seq: int


class Producers:
    """The idempotent producers of one stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._states: OrderedDict[str, _State] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def last_seq(self, producer_id: str) -> int | None:
        """The highest seq accepted for the producer in its epoch, or None if unknown."""
        state = self._states.get(producer_id)
        return None if state is None else state.last_seq

    def epoch(self, producer_id: str) -> int | None:
        """The producer's current epoch, or None if unknown."""
        state = self._states.get(producer_id)
        return None if state is None else state.epoch

    def judge(self, producer: Producer) -> Verdict:
        """Whether the request is new data or a duplicate; :class:`StreamRefused` if it is
        fenced (403), starts an epoch past seq 0 (400) or leaves a gap (409)."""
        state = self._states.get(producer.id)
        if state is None:
            if producer.seq != 0:
                raise StreamRefused(
                    409,
                    "producer_seq_gap",
                    f"producer {producer.id!r} is new here: its first seq must be 0",
                    (("Producer-Expected-Seq", "0"), ("Producer-Received-Seq", str(producer.seq))),
                )
            return Verdict.NEW
        if producer.epoch < state.epoch:
            raise StreamRefused(
                403,
                "producer_fenced",
                f"epoch {producer.epoch} is stale: producer {producer.id!r} is at {state.epoch}",
                (("Producer-Epoch", str(state.epoch)),),
            )
        if producer.epoch > state.epoch:
            if producer.seq != 0:
                raise StreamRefused(
                    400,
                    "bad_producer_seq",
                    f"a new epoch starts at seq 0, not {producer.seq}",
                )
            return Verdict.NEW
        if producer.seq <= state.last_seq:
            return Verdict.DUPLICATE
        if producer.seq > state.last_seq + 1:
            raise StreamRefused(
                409,
                "producer_seq_gap",
                f"producer {producer.id!r} expected seq {state.last_seq + 1}, not {producer.seq}",
                (
                    ("Producer-Expected-Seq", str(state.last_seq + 1)),
                    ("Producer-Received-Seq", str(producer.seq)),
                ),
            )
        return Verdict.NEW

    def states(self) -> list[tuple[str, int, int]]:
        """Every producer's id, epoch and last seq, the least recent first (to store them)."""
        return [(name, state.epoch, state.last_seq) for name, state in self._states.items()]

    def restore(self, states: list[tuple[str, int, int]]) -> None:
        """Take back what :meth:`states` gave (the least recent first), within the limit."""
        self._states.clear()
        for name, epoch, last_seq in states[-self.limit :] if self.limit else []:
            self._states[name] = _State(epoch, last_seq)

    def record(self, producer: Producer) -> None:
        """The producer's request was appended: it is the producer's last seq now."""
        state = self._states.pop(producer.id, None)
        if state is None and len(self._states) >= self.limit:
            self._states.popitem(last=False)
        self._states[producer.id] = _State(producer.epoch, producer.seq)

    def touch(self, producer_id: str) -> None:
        """The producer wrote (a duplicate too): it is the most recent."""
        if producer_id in self._states:
            self._states.move_to_end(producer_id)
