"""The Deployment version by version, replayed from the acknowledged writes, and the writes erased on the way.

Every version after the first is one acknowledged write, so `History` follows the object
exactly and says, as it happens, which write erased which: a write is lost when another
writer's write changes its field before its owner writes that field again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Acknowledge(Protocol):
    """Where a controller hands each acknowledged write: the history, or the store for it (a job over processes)."""

    def acknowledge(self, actor: int, op: int, version_read: int, version: int, values: tuple[int, ...]) -> None: ...


@dataclass(frozen=True)
class Erasure:
    """A write that changed another controller's field before its owner wrote it again."""

    eraser: int
    op: int
    version_read: int
    version: int
    victim: int
    erased_value: int
    set_at: int
    restored_value: int


@dataclass
class _Write:
    actor: int
    op: int
    version_read: int
    version: int
    values: tuple[int, ...]


@dataclass
class History:
    """The object version by version, from its acknowledged writes, and the writes erased on the way.

    Writers hand over each acknowledged write (`acknowledge`) in whatever order their
    threads get here; the writes are applied in version order. `on_erased` is told of
    each lost write once, as it is erased.
    """

    version: int
    values: list[int]
    on_erased: Callable[[Erasure], None] = lambda erasure: None
    set_at: list[int] = field(init=False)
    """For each field, the version whose write set its current value."""
    own_latest: list[int] = field(init=False)
    """For each field, the version of its owner's latest applied write (the initial version before any)."""
    acknowledged: list[dict[int, int]] = field(init=False)
    """For each controller, the version of each value it wrote."""
    lost: list[Erasure] = field(init=False, default_factory=list)
    start: int = field(init=False)
    _lost_writes: set[tuple[int, int]] = field(init=False, default_factory=set)
    _pending: dict[int, _Write] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.start = self.version
        self.set_at = [self.version] * len(self.values)
        self.own_latest = [self.version] * len(self.values)
        self.acknowledged = [{} for _ in self.values]

    def acknowledge(self, actor: int, op: int, version_read: int, version: int, values: tuple[int, ...]) -> None:
        """A write at `version` that left the fields at `values`: a controller's (actor 1..n) or an outside lane's."""
        with self._lock:
            self._pending[version] = _Write(actor, op, version_read, version, values)
            while self.version + 1 in self._pending:
                self._apply(self._pending.pop(self.version + 1))

    @property
    def waiting(self) -> int:
        """Acknowledged writes not applied yet: a version before them was never handed over."""
        return len(self._pending)

    def last_writes(self) -> list[tuple[int | None, int | None, int]]:
        """Per controller: (value, version) of its latest applied write (None before any), and its writes lost."""
        with self._lock:
            rows = []
            for index, written in enumerate(self.acknowledged):
                version = self.own_latest[index]
                value = next((value for value, at in written.items() if at == version), None)
                rows.append((value, version if value is not None else None, self.lost_of(index + 1)))
            return rows

    def lost_of(self, actor: int) -> int:
        return sum(1 for erasure in self.lost if erasure.victim == actor)

    def by_outside_lane(self, actor: int) -> bool:
        """A write from outside the job: its lane follows the controllers'."""
        return actor > len(self.values)

    def _apply(self, write: _Write) -> None:
        if not self.by_outside_lane(write.actor):
            self.acknowledged[write.actor - 1][write.values[write.actor - 1]] = write.version
        for index, value in enumerate(write.values):
            owner = index + 1
            if owner == write.actor:
                self.set_at[index] = self.own_latest[index] = write.version
            elif value != self.values[index]:
                # Erased only if the owner had not written the field again since (a value it had
                # replaced itself, put back by an earlier blind write, is no loss of its own) and
                # not counted already (a lost value put back by a blind write, then erased again).
                set_at = self.set_at[index]
                if set_at == self.own_latest[index] != self.start and (owner, set_at) not in self._lost_writes:
                    self._lost_writes.add((owner, set_at))
                    erasure = Erasure(
                        eraser=write.actor,
                        op=write.op,
                        version_read=write.version_read,
                        version=write.version,
                        victim=owner,
                        erased_value=self.values[index],
                        set_at=self.set_at[index],
                        restored_value=value,
                    )
                    self.lost.append(erasure)
                    self.on_erased(erasure)
                self.set_at[index] = self.acknowledged[index].get(value, self.start)
            self.values[index] = value
        self.version = write.version
