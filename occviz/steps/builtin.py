"""The built-in step scripts, each with the question to ask the class before stepping it.

Rows are Hermitage's, (1, 10) and (2, 20), each at version 1. `BUILTINS` maps a script's name
to it; `scripts()` adds the scripts of Hermitage's suite (hermitage.py).
"""

from __future__ import annotations

from occviz.steps import hermitage
from occviz.steps.script import BuiltinScript

BUILTINS: dict[str, BuiltinScript] = {
    script.name: script
    for script in (
        BuiltinScript(
            "lost-update",
            "Lost update",
            "Both read 10 and write 11: after both commit, is row 1 at 12?",
            """\
# Two clients increment row 1 the way an application does: read, add one, write back.
T1: begin
T2: begin
T1: select * from test where id = 1
T2: select * from test where id = 1
T1: update test set value = 11 where id = 1
T1: commit
T2: update test set value = 11 where id = 1
T2: commit
""",
        ),
        BuiltinScript(
            "occ-conflict",
            "Lost update, with compare-and-swap",
            "Both read version 1 and write only if it is still version 1: what does the second write do?",
            """\
# The same increments, each written only if the row is still at the version read (optimistic concurrency).
T1: begin
T2: begin
T1: select * from test where id = 1
T2: select * from test where id = 1
T1: update test set value = 11, version = version + 1 where id = 1 and version = 1
T1: commit
T2: update test set value = 11, version = version + 1 where id = 1 and version = 1
T2: commit
""",
        ),
        BuiltinScript(
            "for-update-wait",
            "A lock wait (FOR UPDATE)",
            "T1 locks row 1 with FOR UPDATE; when T2 asks for the same lock, what happens, and when does it go on?",
            """\
# Pessimistic: read with FOR UPDATE, so the second reader waits for the first to finish.
T1: begin
T2: begin
T1: select * from test where id = 1 for update
T2: select * from test where id = 1 for update
T1: update test set value = 11 where id = 1
T1: commit
T2: update test set value = 12 where id = 1
T2: commit
""",
        ),
        BuiltinScript(
            "deadlock",
            "Deadlock",
            "T1 updates row 1 then row 2, T2 row 2 then row 1: who waits for whom, and who does PostgreSQL stop?",
            """\
# Two transactions take the same two row locks in opposite order.
T1: begin
T2: begin
T1: update test set value = 11 where id = 1
T2: update test set value = 21 where id = 2
T1: update test set value = 12 where id = 2
T2: update test set value = 22 where id = 1
T1: commit
T2: commit
""",
        ),
        BuiltinScript(
            "write-skew-rr",
            "Write skew at repeatable read",
            "Each reads both rows and changes a different one: can both commit at repeatable read?",
            """\
# The rule is "value(1) + value(2) must stay 30 or more"; each checks it, then lowers a different row.
T1: begin isolation level repeatable read
T2: begin isolation level repeatable read
T1: select * from test where id in (1, 2)
T2: select * from test where id in (1, 2)
T1: update test set value = 0 where id = 1
T2: update test set value = 0 where id = 2
T1: commit
T2: commit
""",
            isolation="repeatable read",
        ),
        BuiltinScript(
            "write-skew-serializable",
            "Write skew at serializable",
            "The same two transactions at serializable: which one commits, and what does the other get?",
            """\
# The same rule and the same two transactions, now serializable.
T1: begin isolation level serializable
T2: begin isolation level serializable
T1: select * from test where id in (1, 2)
T2: select * from test where id in (1, 2)
T1: update test set value = 0 where id = 1
T2: update test set value = 0 where id = 2
T1: commit
T2: commit
""",
            isolation="serializable",
        ),
    )
}


def scripts() -> dict[str, BuiltinScript]:
    """Every built-in script by name: the ones above, then Hermitage's suite."""
    return {**BUILTINS, **hermitage.hermitage_scripts()}
