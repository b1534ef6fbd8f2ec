"""Hermitage's PostgreSQL suite as step scripts, each with the check that reads its outcome.

Hermitage (github.com/ept/hermitage, postgres.md) tests ten anomalies by hand in psql; here
each test is a step script run at read committed, repeatable read and serializable,
named `hermitage-<anomaly>-<level>` (`hermitage-g-single-repeatable-read`). An anomaly
Hermitage tests in several ways has one script per way, the variant a further word:
`hermitage-pmp-write-...` (a write predicate), `hermitage-g-single-predicate-...` and
`hermitage-g-single-write-...`, `hermitage-g2-two-edges-...` (Fekete et al.'s example).
A cell of the table is all the scripts of its anomaly at its level: prevented only when
every one of them was.

The scripts are Hermitage's, statement for statement, with two readings made explicit:
- a lone `select` after a `commit` ran in psql's autocommit, a transaction of its own:
  here it is followed by its own `commit`;
- where Hermitage ends a transaction that failed with `abort` ("there's nothing else we can
  do"), the script says `commit`, as the tests at the levels that let it through do: on a
  transaction that failed it rolls back all the same, and where none failed it commits, so
  the same script serves every level.

A check decides from a run's steps (their outcomes and the rows each read returned) and
its final rows whether the anomaly occurred, naming the read that shows it; `how` says
what prevented it otherwise: an abort with 40001 (or 40P01), a lock wait that resolved, or
reads that showed no anomaly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from occviz.steps.script import BuiltinScript

LEVELS = ("read committed", "repeatable read", "serializable")
ANOMALIES = ("G0", "G1a", "G1b", "G1c", "OTV", "PMP", "P4", "G-single", "G2-item", "G2")
NAMES = {
    "G0": "write cycles (dirty writes)",
    "G1a": "aborted reads",
    "G1b": "intermediate reads",
    "G1c": "circular information flow",
    "OTV": "observed transaction vanishes",
    "PMP": "predicate-many-preceders",
    "P4": "lost update",
    "G-single": "read skew (single anti-dependency cycle)",
    "G2-item": "write skew (item anti-dependency cycle)",
    "G2": "anti-dependency cycles (predicate write skew)",
}

PREVENTED, OCCURS, READ_ONLY = "✓", "—", "R/O"
"""A cell as Hermitage's table marks it: prevented, not prevented, prevented only in a read-only transaction."""


def _row(*marks: str) -> dict[str, str]:
    return dict(zip(ANOMALIES, marks, strict=True))


_ALL = _row(*[PREVENTED] * 10)
PUBLISHED: dict[str, dict[str, dict[str, str]]] = {
    "postgresql": {
        "read committed": _row(*[PREVENTED] * 5, *[OCCURS] * 5),
        "repeatable read": _row(*[PREVENTED] * 8, OCCURS, OCCURS),
        "serializable": _ALL,
    },
    "mysql": {
        "read committed": _row(*[PREVENTED] * 5, *[OCCURS] * 5),
        "repeatable read": _row(*[PREVENTED] * 5, READ_ONLY, OCCURS, READ_ONLY, OCCURS, OCCURS),
        "serializable": _ALL,
    },
}
"""Hermitage's published rows (its README): PostgreSQL's, and MySQL/InnoDB's."""

Row = Mapping[str, int]


def level_slug(level: str) -> str:
    return level.replace(" ", "-")


def rows_text(rows: Sequence[Row] | None) -> str:
    if not rows:
        return "nothing"
    return ", ".join(f"{row['id']} => {row['value']}" for row in rows)


class Run:
    """One run of a script, as its step job's summary reports it, read by the tags of the script's lines."""

    def __init__(self, steps: Sequence[Mapping[str, Any]], final: Mapping[str, int], lines: Mapping[str, int]):
        self.steps = list(steps)
        self.final = {int(key): value for key, value in final.items()}
        self.lines = lines
        self._by_line = {int(step["line"]): step for step in steps}

    def step(self, tag: str) -> Mapping[str, Any] | None:
        return self._by_line.get(self.lines[tag])

    def line(self, tag: str) -> int:
        return self.lines[tag]

    def ran(self, tag: str) -> bool:
        """The step ran to success (at once, or after a lock wait)."""
        step = self.step(tag)
        return step is not None and (step["outcome"] == "ok" or step.get("then") == "ok")

    def rows(self, tag: str) -> list[Row] | None:
        """What a read returned, or None if it did not run to success."""
        step = self.step(tag)
        return list(step.get("rows") or []) if step is not None and self.ran(tag) else None

    def value(self, tag: str, row_id: int) -> int | None:
        return next((row["value"] for row in self.rows(tag) or [] if row["id"] == row_id), None)

    def count(self, tag: str) -> int | None:
        step = self.step(tag)
        if step is None or not self.ran(tag):
            return None
        rows = step.get("rows")
        return len(rows) if rows is not None else step.get("count")

    def committed(self, actor: str, commit: str) -> bool:
        """The actor's transaction ending at `commit` committed: no step of it up to there failed."""
        last = self.lines[commit]
        mine = [step for step in self.steps if step["actor"] == actor and step["line"] <= last]
        failed = any(step["outcome"] == "error" or step.get("then") == "error" for step in mine)
        return not failed and self.ran(commit)

    def read(self, tag: str) -> str:
        """A read as the table names it: "T2 read 1 => 10 (line 4)"."""
        step = self.step(tag)
        actor = step["actor"] if step is not None else "?"
        return f"{actor} read {rows_text(self.rows(tag))} (line {self.line(tag)})"

    def errors(self) -> list[Mapping[str, Any]]:
        """Each actor's first failed step: what the database refused (later ones follow from it)."""
        first: dict[str, Mapping[str, Any]] = {}
        for step in self.steps:
            if (step["outcome"] == "error" or step.get("then") == "error") and step["actor"] not in first:
                first[step["actor"]] = step
        return list(first.values())

    def waits(self) -> list[Mapping[str, Any]]:
        return [step for step in self.steps if step["outcome"] == "blocked"]


@dataclass(frozen=True)
class Verdict:
    occurred: bool
    evidence: str
    """The read (or the commits) that show the anomaly, or that show none."""


Check = Callable[[Run], Verdict]


@dataclass(frozen=True)
class HermitageTest:
    """One of Hermitage's tests at one level: its script (lines tagged for its check) and its check."""

    anomaly: str
    variant: str
    """"" for the test Hermitage names after the anomaly; else "predicate", "write", "two-edges"."""
    level: str
    steps: tuple[tuple[str, str, str], ...]
    """(actor, statement, tag): the tag names the line for the check ("" for none)."""
    check: Check
    question: str
    read_only: bool
    """The transaction that would show the anomaly only reads (Hermitage's R/O: prevented there, not with writes)."""
    lines: dict[str, int] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        tags = {tag: number for number, (_, _, tag) in enumerate(self.steps, start=1) if tag}
        object.__setattr__(self, "lines", tags)

    @property
    def name(self) -> str:
        variant = f"-{self.variant}" if self.variant else ""
        return f"hermitage-{self.anomaly.lower()}{variant}-{level_slug(self.level)}"

    @property
    def text(self) -> str:
        return "\n".join(f"{actor}: {statement}" for actor, statement, _ in self.steps) + "\n"

    @property
    def builtin(self) -> BuiltinScript:
        what = f", {self.variant.replace('-', ' ')}" if self.variant else ""
        return BuiltinScript(
            self.name,
            f"Hermitage {self.anomaly} ({NAMES[self.anomaly]}{what}), {self.level}",
            self.question,
            self.text,
            isolation=self.level,
        )

    def judge(self, steps: Sequence[Mapping[str, Any]], final: Mapping[str, int]) -> dict[str, Any]:
        """Whether this run showed the anomaly, and how it was prevented otherwise."""
        run = Run(steps, final, self.lines)
        verdict = self.check(run)
        return {
            "script": self.name,
            "variant": self.variant or "basic",
            "read_only": self.read_only,
            "prevented": not verdict.occurred,
            "how": verdict.evidence if verdict.occurred else prevented_how(run, verdict.evidence),
        }


def prevented_how(run: Run, evidence: str) -> str:
    """What stopped the anomaly: an abort the database chose, a lock wait, or nothing (the reads were right)."""
    said = []
    for step in run.errors():
        if step.get("sqlstate") in ("40001", "40P01"):
            said.append(
                f"aborted with {step['sqlstate']}: {step['actor']} on line {step['line']} ({step.get('message')})"
            )
        else:
            said.append(f"{step['actor']} failed on line {step['line']}: {step.get('sqlstate')} {step.get('message')}")
    for step in run.waits():
        waited = " and ".join(step.get("blocked_by") or []) or "a lock"
        then = "went on" if step.get("then") == "ok" else "was refused"
        said.append(f"blocked then resolved: {step['actor']} waited for {waited} on line {step['line']}, then {then}")
    if not said:
        return f"the reads showed no anomaly: {evidence}"
    return "; ".join(said) + f" ({evidence})"


def _begin(actor: str, level: str) -> tuple[str, str, str]:
    return (actor, f"begin; set transaction isolation level {level}", "")


# -- the tests, as postgres.md writes them --------------------------------------------------


def _g0(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        both = run.committed("T1", "t1_commit") and run.committed("T2", "t2_commit")
        rows = run.rows("final") or [{"id": int(i), "value": v} for i, v in sorted(run.final.items())]
        seen = {row["id"]: row["value"] for row in rows}
        writers = {1: {11: "T1", 12: "T2"}.get(seen.get(1, 0)), 2: {21: "T1", 22: "T2"}.get(seen.get(2, 0))}
        mixed = both and None not in writers.values() and writers[1] != writers[2]
        if mixed:
            return Verdict(True, f"{run.read('final')}: row 1 last written by {writers[1]}, row 2 by {writers[2]}")
        return Verdict(False, f"{run.read('final')}")

    return HermitageTest(
        "G0",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "update test set value = 11 where id = 1", ""),
            ("T2", "update test set value = 12 where id = 1", ""),
            ("T1", "update test set value = 21 where id = 2", ""),
            ("T1", "commit", "t1_commit"),
            ("T1", "select * from test", ""),
            ("T1", "commit", ""),
            ("T2", "update test set value = 22 where id = 2", ""),
            ("T2", "commit", "t2_commit"),
            ("T2", "select * from test", "final"),
            ("T2", "commit", ""),
        ),
        check,
        "T1 and T2 both write rows 1 and 2: can the rows end up half T1's and half T2's?",
        read_only=False,
    )


def _g1a(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        for tag in ("before_abort", "after_abort"):
            if run.value(tag, 1) == 101:
                return Verdict(True, f"{run.read(tag)}: T1's write, which T1 then aborted")
        return Verdict(False, f"{run.read('before_abort')}, {run.read('after_abort')}")

    return HermitageTest(
        "G1a",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "update test set value = 101 where id = 1", ""),
            ("T2", "select * from test", "before_abort"),
            ("T1", "abort", ""),
            ("T2", "select * from test", "after_abort"),
            ("T2", "commit", ""),
        ),
        check,
        "T1 writes 101 and then aborts: can T2 ever read 101?",
        read_only=True,
    )


def _g1b(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        for tag in ("before", "after"):
            if run.value(tag, 1) == 101:
                return Verdict(True, f"{run.read(tag)}: T1's intermediate value, never committed")
        return Verdict(False, f"{run.read('before')}, {run.read('after')}")

    return HermitageTest(
        "G1b",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "update test set value = 101 where id = 1", ""),
            ("T2", "select * from test", "before"),
            ("T1", "update test set value = 11 where id = 1", ""),
            ("T1", "commit", ""),
            ("T2", "select * from test", "after"),
            ("T2", "commit", ""),
        ),
        check,
        "T1 writes 101, then 11, then commits: can T2 read the 101 in between?",
        read_only=True,
    )


def _g1c(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        if run.value("t1_read", 2) == 22 and run.value("t2_read", 1) == 11:
            return Verdict(True, f"{run.read('t1_read')} and {run.read('t2_read')}: each saw the other's write")
        return Verdict(False, f"{run.read('t1_read')}, {run.read('t2_read')}")

    return HermitageTest(
        "G1c",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "update test set value = 11 where id = 1", ""),
            ("T2", "update test set value = 22 where id = 2", ""),
            ("T1", "select * from test where id = 2", "t1_read"),
            ("T2", "select * from test where id = 1", "t2_read"),
            ("T1", "commit", ""),
            ("T2", "commit", ""),
        ),
        check,
        "Each writes one row and reads the other's: can each see the other's uncommitted write?",
        read_only=False,
    )


# The values OTV's rows go through: as first inserted, after T1, after T2.
_OTV_STATES = {1: {10: 0, 11: 1, 12: 2}, 2: {20: 0, 19: 1, 18: 2}}
_OTV_WRITERS = {0: "the first rows", 1: "T1's", 2: "T2's"}


def _otv(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        latest, latest_tag = -1, ""
        for tag in ("r1", "r2", "r3", "r4"):
            for row in run.rows(tag) or []:
                state = _OTV_STATES.get(row["id"], {}).get(row["value"])
                if state is None:
                    continue
                if state < latest:
                    return Verdict(
                        True,
                        f"{run.read(latest_tag)}, {_OTV_WRITERS[latest]} write, then {run.read(tag)}, "
                        f"{_OTV_WRITERS[state]}: a transaction it had seen vanished",
                    )
                if state > latest:
                    latest, latest_tag = state, tag
        return Verdict(False, ", then ".join(run.read(tag) for tag in ("r1", "r2", "r3", "r4")))

    return HermitageTest(
        "OTV",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            _begin("T3", level),
            ("T1", "update test set value = 11 where id = 1", ""),
            ("T1", "update test set value = 19 where id = 2", ""),
            ("T2", "update test set value = 12 where id = 1", ""),
            ("T1", "commit", ""),
            ("T3", "select * from test where id = 1", "r1"),
            ("T2", "update test set value = 18 where id = 2", ""),
            ("T3", "select * from test where id = 2", "r2"),
            ("T2", "commit", ""),
            ("T3", "select * from test where id = 2", "r3"),
            ("T3", "select * from test where id = 1", "r4"),
            ("T3", "commit", ""),
        ),
        check,
        "T3 reads while T1 and then T2 rewrite both rows: once T3 has seen a write, can it vanish again?",
        read_only=True,
    )


def _pmp(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        if any(row["id"] == 3 for row in run.rows("again") or []):
            return Verdict(True, f"{run.read('again')}: the row T2 inserted after T1's first predicate read")
        return Verdict(False, f"{run.read('first')}, then {run.read('again')}")

    return HermitageTest(
        "PMP",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "select * from test where value = 30", "first"),
            ("T2", "insert into test (id, value) values (3, 30)", ""),
            ("T2", "commit", ""),
            ("T1", "select * from test where value % 3 = 0", "again"),
            ("T1", "commit", ""),
        ),
        check,
        "T1 finds no row of value 30; T2 inserts one and commits: does T1's next predicate read find it?",
        read_only=True,
    )


def _pmp_write(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        left = [row for row in run.rows("after") or [] if row["value"] == 20]
        if run.ran("delete") and left:
            return Verdict(True, f"{run.read('after')} after deleting the rows of value 20 (line {run.line('delete')})")
        return Verdict(False, run.read("after") if run.rows("after") is not None else "T2's delete did not run")

    return HermitageTest(
        "PMP",
        "write",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "update test set value = value + 10", ""),
            ("T2", "delete from test where value = 20", "delete"),
            ("T1", "commit", ""),
            ("T2", "select * from test where value = 20", "after"),
            ("T2", "commit", ""),
        ),
        check,
        "T1 adds 10 to every row; T2 deletes the rows of value 20: does a row of value 20 survive T2's delete?",
        read_only=False,
    )


def _p4(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        if run.committed("T1", "t1_commit") and run.committed("T2", "t2_commit"):
            return Verdict(
                True,
                f"{run.read('t1_read')} and {run.read('t2_read')}, both wrote 11 and both committed: "
                "one increment lost",
            )
        return Verdict(False, "only one of the two updates committed")

    return HermitageTest(
        "P4",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "select * from test where id = 1", "t1_read"),
            ("T2", "select * from test where id = 1", "t2_read"),
            ("T1", "update test set value = 11 where id = 1", ""),
            ("T2", "update test set value = 11 where id = 1", ""),
            ("T1", "commit", "t1_commit"),
            ("T2", "commit", "t2_commit"),
        ),
        check,
        "Both read 10 and write 11: can both commit, one increment lost?",
        read_only=False,
    )


def _g_single(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        if run.value("first", 1) == 10 and run.value("second", 2) == 18:
            return Verdict(True, f"{run.read('first')} before T2, then {run.read('second')} after T2: a skewed view")
        return Verdict(False, f"{run.read('first')}, then {run.read('second')}")

    return HermitageTest(
        "G-single",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "select * from test where id = 1", "first"),
            ("T2", "select * from test where id = 1", ""),
            ("T2", "select * from test where id = 2", ""),
            ("T2", "update test set value = 12 where id = 1", ""),
            ("T2", "update test set value = 18 where id = 2", ""),
            ("T2", "commit", ""),
            ("T1", "select * from test where id = 2", "second"),
            ("T1", "commit", ""),
        ),
        check,
        "T2 moves 2 from row 2 to row 1 between T1's two reads: can T1 see 10 and 18?",
        read_only=True,
    )


def _g_single_predicate(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        if run.rows("second"):
            return Verdict(True, f"{run.read('first')}, then {run.read('second')}: T2's write, after T1 saw 10")
        return Verdict(False, f"{run.read('first')}, then {run.read('second')}")

    return HermitageTest(
        "G-single",
        "predicate",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "select * from test where value % 5 = 0", "first"),
            ("T2", "update test set value = 12 where value = 10", ""),
            ("T2", "commit", ""),
            ("T1", "select * from test where value % 3 = 0", "second"),
            ("T1", "commit", ""),
        ),
        check,
        "T1 reads the multiples of 5; T2 turns 10 into 12: does T1's next predicate read see the 12?",
        read_only=True,
    )


def _g_single_write(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        if run.value("first", 1) == 10 and run.ran("delete") and run.count("delete") == 0:
            return Verdict(
                True,
                f"{run.read('first')} before T2, but its delete of value 20 (line {run.line('delete')}) "
                "found nothing: it saw T2's write to row 2",
            )
        if run.ran("delete"):
            return Verdict(False, f"{run.read('first')}; its delete of value 20 deleted {run.count('delete')} row")
        return Verdict(False, f"{run.read('first')}; its delete did not run")

    return HermitageTest(
        "G-single",
        "write",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "select * from test where id = 1", "first"),
            ("T2", "select * from test", ""),
            ("T2", "update test set value = 12 where id = 1", ""),
            ("T2", "update test set value = 18 where id = 2", ""),
            ("T2", "commit", ""),
            ("T1", "delete from test where value = 20", "delete"),
            ("T1", "commit", ""),
        ),
        check,
        "T1 saw row 1 before T2 rewrote both rows: does its delete of value 20 see row 2 as before or after T2?",
        read_only=False,
    )


def _g2_item(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        if run.committed("T1", "t1_commit") and run.committed("T2", "t2_commit"):
            return Verdict(
                True,
                f"{run.read('t1_read')} and {run.read('t2_read')}; each changed a different row and both committed",
            )
        return Verdict(False, "only one of the two transactions committed")

    return HermitageTest(
        "G2-item",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "select * from test where id in (1, 2)", "t1_read"),
            ("T2", "select * from test where id in (1, 2)", "t2_read"),
            ("T1", "update test set value = 11 where id = 1", ""),
            ("T2", "update test set value = 21 where id = 2", ""),
            ("T1", "commit", "t1_commit"),
            ("T2", "commit", "t2_commit"),
        ),
        check,
        "Each reads both rows and changes a different one: can both commit?",
        read_only=False,
    )


def _g2(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        if run.committed("T1", "t1_commit") and run.committed("T2", "t2_commit"):
            return Verdict(
                True, f"both inserted after finding no multiple of 3, and both committed: {run.read('either')}"
            )
        return Verdict(False, f"only one insert committed: {run.read('either')}")

    return HermitageTest(
        "G2",
        "",
        level,
        (
            _begin("T1", level),
            _begin("T2", level),
            ("T1", "select * from test where value % 3 = 0", ""),
            ("T2", "select * from test where value % 3 = 0", ""),
            ("T1", "insert into test (id, value) values (3, 30)", ""),
            ("T2", "insert into test (id, value) values (4, 42)", ""),
            ("T1", "commit", "t1_commit"),
            ("T2", "commit", "t2_commit"),
            ("T1", "select * from test where value % 3 = 0", "either"),
            ("T1", "commit", ""),
        ),
        check,
        "Both find no multiple of 3 and each inserts one: can both commit?",
        read_only=False,
    )


def _g2_two_edges(level: str) -> HermitageTest:
    def check(run: Run) -> Verdict:
        all_three = all(
            run.committed(actor, tag) for actor, tag in (("T1", "t1_commit"), ("T2", "t2_commit"), ("T3", "t3_commit"))
        )
        skewed = run.value("t3_read", 2) == 25 and run.value("t3_read", 1) == 10 and run.value("t1_read", 2) == 20
        if all_three and skewed:
            return Verdict(
                True,
                f"{run.read('t3_read')}: T2's write but not T1's, while {run.read('t1_read')} before T2; "
                "all three committed",
            )
        return Verdict(False, f"{run.read('t3_read')}; not all three committed")

    return HermitageTest(
        "G2",
        "two-edges",
        level,
        (
            _begin("T1", level),
            ("T1", "select * from test", "t1_read"),
            _begin("T2", level),
            ("T2", "update test set value = value + 5 where id = 2", ""),
            ("T2", "commit", "t2_commit"),
            _begin("T3", level),
            ("T3", "select * from test", "t3_read"),
            ("T3", "commit", "t3_commit"),
            ("T1", "update test set value = 0 where id = 1", ""),
            ("T1", "commit", "t1_commit"),
        ),
        check,
        "T1 read before T2, T3 after T2 but before T1's write: can all three commit?",
        read_only=False,
    )


_MAKERS: tuple[Callable[[str], HermitageTest], ...] = (
    _g0,
    _g1a,
    _g1b,
    _g1c,
    _otv,
    _pmp,
    _pmp_write,
    _p4,
    _g_single,
    _g_single_predicate,
    _g_single_write,
    _g2_item,
    _g2,
    _g2_two_edges,
)

TESTS: dict[str, HermitageTest] = {test.name: test for level in LEVELS for test in (make(level) for make in _MAKERS)}
"""Every test at every level, by script name."""


def scripts_of_cell(anomaly: str, level: str) -> list[HermitageTest]:
    """The scripts of one cell of the table."""
    return [test for test in TESTS.values() if test.anomaly == anomaly and test.level == level]


def hermitage_scripts() -> dict[str, BuiltinScript]:
    """The suite's scripts as built-in step scripts, by name."""
    return {name: test.builtin for name, test in TESTS.items()}


def cell(anomaly: str, level: str, judged: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One cell from its scripts' verdicts (each `HermitageTest.judge`'s, with its job): prevented only if all were."""
    prevented = all(found["prevented"] for found in judged)
    if prevented:
        mark = PREVENTED
    elif all(found["prevented"] for found in judged if found["read_only"]) and any(
        found["read_only"] for found in judged
    ):
        mark = READ_ONLY
    else:
        mark = OCCURS
    if len(judged) == 1:
        how = judged[0]["how"]
    else:
        how = " | ".join(f"{found['variant']}: {found['how']}" for found in judged)
    return {
        "prevented": prevented,
        "mark": mark,
        "how": how,
        "jobs": [found["job"] for found in judged if found.get("job") is not None],
        "variants": list(judged),
    }


def differences(measured: Mapping[str, Mapping[str, Mapping[str, Any]]], published: str) -> list[str]:
    """Where a measured table (level -> anomaly -> cell) differs from Hermitage's published row of `published`."""
    found = []
    for level, row in PUBLISHED[published].items():
        for anomaly, mark in row.items():
            cell_found = measured.get(level, {}).get(anomaly)
            if cell_found is None:
                continue
            if cell_found["mark"] != mark:
                found.append(f"{anomaly} at {level}: measured {cell_found['mark']}, Hermitage {mark}")
    return found
