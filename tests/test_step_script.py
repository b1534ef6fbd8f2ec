"""Step scripts: what the grammar lets through to the database, and what it refuses, with the line that is wrong.

The statements go to a real PostgreSQL, so the tests of refusals matter most: anything but
the grammar (another statement after `;`, a function, a string, another table) is refused
before anything is made. The form and `runjob`'s flags refuse a bad script the same way.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from occviz.jobs.models import Job
from occviz.jobs.registry import ParamsError
from occviz.jobs.tasks import create_job
from occviz.steps.builtin import BUILTINS
from occviz.steps.postgres import SCHEMA_PREFIX
from occviz.steps.script import (
    DEFAULT_ROWS,
    MAX_STEPS,
    Begin,
    ScriptError,
    StepKind,
    evaluate,
    parse,
    parse_statement,
    render,
)


def kinds(text: str) -> list[str]:
    return [step.kind.value for step in parse(text).steps]


def test_each_step_is_classified_as_a_class_is_taught_to_tell_them_apart() -> None:
    script = parse(
        """
        T1: begin
        T2: select * from test where id = 1
        T2: select id, value from test where value % 3 = 0
        T1: select * from test where id = 1 for update
        T1: select * from test where id in (1, 2) for share
        T1: update test set value = 11 where id = 1
        T2: update test set value = 11, version = version + 1 where id = 1 and version = 1
        T2: insert into test (id, value) values (3, 30), (4, 42)
        T1: delete from test where value = 20
        T1: commit
        T2: rollback
        """
    )
    assert [step.kind for step in script.steps] == [
        StepKind.BEGIN,
        StepKind.READ,
        StepKind.PREDICATE_READ,
        StepKind.LOCKING_READ,
        StepKind.LOCKING_READ,
        StepKind.BLIND_WRITE,
        StepKind.CAS_WRITE,
        StepKind.INSERT,
        StepKind.DELETE,
        StepKind.COMMIT,
        StepKind.ABORT,
    ]
    assert script.actors == ("T1", "T2")
    assert script.rows == DEFAULT_ROWS
    assert [step.line for step in script.steps] == list(range(2, 13))


def test_hermitages_spelling_of_begin_comments_and_case_are_accepted() -> None:
    script = parse(
        "-- G1a\n"
        "T1: begin; set transaction isolation level read committed; -- T1\n"
        + "t2: BEGIN ISOLATION LEVEL SERIALIZABLE;\n"
        + "T1: update test set value = 101 where id = 1; -- T1\n"
        + "# a comment line\n"
        + "T2: select * from test; -- T2. Still shows 1 => 10\n"
        + "T1: abort;  -- T1\n"
        + "T2: start transaction isolation level repeatable read\n"
    )
    begins = [step.statement for step in script.steps if step.kind == StepKind.BEGIN]
    assert begins == [Begin("read committed"), Begin("serializable"), Begin("repeatable read")]
    assert script.steps[1].actor == "T2"
    assert script.steps[2].text == "update test set value = 101 where id = 1"


def test_the_sql_sent_is_rendered_from_the_parsed_statement_not_the_text() -> None:
    statement, _ = parse_statement("SELECT value FROM test WHERE NOT value <> 20 OR id IN (1, -2) FOR UPDATE;")
    assert render(statement) == (
        "SELECT id, value, version FROM test WHERE ((NOT (value <> 20)) OR (id IN (1, (-2)))) FOR UPDATE"
    )
    statement, _ = parse_statement("update test set value = value * 2 - 1 where id = 1 and version != 3")
    assert render(statement) == "UPDATE test SET value = ((value * 2) - 1) WHERE ((id = 1) AND (version <> 3))"


@pytest.mark.parametrize(
    ("expression", "row", "expected"),
    [
        ("value % 3 = 0", {"id": 3, "value": 30, "version": 1}, True),
        ("value / 4 = -2", {"id": 1, "value": -10, "version": 1}, True),  # SQL truncates towards zero
        ("value % 4 = -2", {"id": 1, "value": -10, "version": 1}, True),  # the remainder takes the dividend's sign
        ("id not in (1, 2) and not version > 1", {"id": 3, "value": 0, "version": 1}, True),
        ("value / 0 = 1", {"id": 1, "value": 1, "version": 1}, None),
    ],
)
def test_expressions_evaluate_as_postgresql_computes_them(
    expression: str, row: dict[str, int], expected: object
) -> None:
    statement, _ = parse_statement(f"select * from test where {expression}")
    assert evaluate(statement.where, row) == expected  # type: ignore[union-attr, arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("T1: begin\nT5: commit", "line 2: T5 is not an actor (T1 to T4)"),
        ("T1: begin\nT2: drop table test", "line 2: unknown statement 'drop'"),
        ("T1: begin\nT2: select * from test; drop table test", "line 2: one statement a step: nothing may follow ';'"),
        ("T1: begin\nT2: select * from pg_authid", "line 2: the table is test, not 'pg_authid'"),
        ("T1: begin\nT2: select * from test where pg_sleep(10) = 1", "line 2: functions are not part of a step"),
        ("T1: begin\nT2: update test set value = '1'", "line 2: strings and quoted names are not part of a step"),
        ("T1: begin\nT2: update test set value = $$1$$", "line 2: strings and quoted names are not part of a step"),
        ("T1: begin\nT2: update test set id = 3", "line 2: update sets value or version, not id"),
        ("T1: begin\nT2: update test set value = 1 where value", "line 2: the where clause must be a condition"),
        ("T1: begin\nT2: select * from test where id = 1 = 1", "line 2: unexpected '='"),
        ("T1: begin\nT2: select * from test where id = 99999999999", "line 2: 99999999999 is too large"),
        ("T1: begin\nT2: insert into test (id) values (3)", "line 2: insert needs value"),
        ("T1: begin\nT2: insert into test (id, value) values (3)", "line 2: 1 values for 2 columns"),
        ("T1: begin\nT2: select * from test where owner = 1", "line 2: unknown column 'owner'"),
        ("T1: begin\nT2: commit\nT3 commit", "line 3: a step is ACTOR: STATEMENT"),
        ("T1: begin\nT2: select * from test where id = 1 for no key update", "line 2: expected 'update' or 'share'"),
        ("T1: begin\nT2: vacuum", "line 2: unknown statement 'vacuum'"),
        ("T1: begin\nT2: select * from test where value = ٣", "line 2: only plain ASCII characters"),
        ("T1: begin\nT1: commit", "a script needs 2 to 4 actors; it has only T1"),
        ("T1: begin\nT3: commit", "line 2: the actors are T1, T3: number them T1, T2"),
        ("T1: begin\nrows: 1=10\nT2: commit", "line 2: the rows are given once, before the first step"),
        ("rows: 1=10 1=20\nT1: begin\nT2: commit", "line 1: row 1 is given twice"),
        ("rows: 1=ten\nT1: begin\nT2: commit", "line 1: '1=ten' is not ID=VALUE"),
        ("\n\n# nothing", "the script has no steps"),
        ("T1: begin\nT2: select * from test where id = " + "1" * 500, "line 2: a line of 534 characters (at most 400)"),
    ],
)
def test_a_bad_line_is_refused_with_its_number_and_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ScriptError) as refused:
        parse(text)
    assert message in str(refused.value)


def test_a_script_has_at_most_200_steps() -> None:
    lines = [f"T{1 + n % 2}: select * from test" for n in range(MAX_STEPS)]
    assert len(parse("\n".join(lines)).steps) == MAX_STEPS
    with pytest.raises(ScriptError, match=f"line {MAX_STEPS + 1}: more than {MAX_STEPS} steps"):
        parse("\n".join([*lines, "T1: commit"]))


def test_a_script_may_give_its_own_rows() -> None:
    script = parse("rows: 1=5, 7=-3 9=0\nT1: select * from test\nT2: select * from test")
    assert script.rows == ((1, 5), (7, -3), (9, 0))


def test_every_builtin_script_parses_with_its_question() -> None:
    assert set(BUILTINS) >= {
        "lost-update", "occ-conflict", "for-update-wait", "deadlock", "write-skew-rr", "write-skew-serializable",
    }  # fmt: skip
    for builtin in BUILTINS.values():
        assert builtin.script.actors == ("T1", "T2")
        assert builtin.question.endswith("?")


def step_schemas() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", [SCHEMA_PREFIX])
        return [name for (name,) in cursor.fetchall()]


@pytest.mark.django_db
def test_the_form_refuses_a_bad_line_with_its_number_and_creates_nothing() -> None:
    with pytest.raises(ParamsError) as refused:
        create_job("step", {"text": "T1: begin\nT2: select * from test; delete from test"})
    assert refused.value.errors == {
        "text": ["line 2: one statement a step: nothing may follow ';' in 'select * from test; delete from test'"]
    }
    with pytest.raises(ParamsError) as both:
        create_job("step", {"script": "deadlock", "text": "T1: begin\nT2: begin"})
    assert both.value.errors == {"text": ["Choose a built-in script or write one, not both."]}
    with pytest.raises(ParamsError) as unknown:
        create_job("step", {"script": "no-such-script"})
    assert "no-such-script is not one of the available choices" in unknown.value.errors["script"][0]
    with pytest.raises(ParamsError) as timeout:
        create_job("step", {"lock_timeout": 500})
    assert timeout.value.errors["lock_timeout"] == ["Ensure this value is less than or equal to 120."]
    assert not Job.objects.exists()
    assert step_schemas() == []


@pytest.mark.django_db
def test_a_job_without_a_script_runs_the_lost_update_and_counts_its_connections() -> None:
    job = create_job("step", {})
    assert job.params["script"] == "lost-update" and job.params["pace"] == "by hand"
    assert job.params["isolation"] == "read committed" and job.params["lock_timeout"] == 30.0
    from occviz.jobs.tasks import connections_needed

    three_actors = create_job("step", {"text": "T1: begin\nT2: begin\nT3: begin"})
    assert connections_needed("step", three_actors.params) - connections_needed("step", job.params) == 1


def test_runjob_refuses_a_bad_script_line_with_its_number_and_starts_nothing(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "step", "--text", "T1: begin\nT2: update test set value = 1\nT5: commit", "--json")
    assert result.returncode == 2, result.stderr
    assert "--text: line 3: T5 is not an actor (T1 to T4)" in result.stderr
    assert result.stdout == ""
    assert not Job.objects.exists()
    assert step_schemas() == []


@pytest.mark.django_db
def test_the_launch_page_refuses_a_bad_line_inline_and_offers_the_builtin_scripts(signed_in: Client) -> None:
    page = signed_in.get("/jobs/new/step/").content.decode()
    for name in BUILTINS:
        assert f'data-preset="{name}"' in page
    response = signed_in.post("/jobs/new/step/", {"text": "T1: begin\n\nT2: select * from test where id = 1 or 1"})
    assert response.status_code == 400
    assert "line 3: &#x27;or&#x27; joins conditions, not numbers" in response.content.decode()
    assert not Job.objects.exists()


def test_the_step_engine_imports_neither_django_nor_the_rest_of_occviz() -> None:
    """The anomalies suite drives it against MySQL too: it is handed what it needs, it reaches for nothing."""
    from tests.test_architecture import PACKAGE, imports_in, package_of

    found = []
    for path in sorted((PACKAGE / "steps").rglob("*.py")):
        for line, name in imports_in(path.read_text(), package_of(path)):
            if name.split(".")[0] == "django" or (name.startswith("occviz.") and not name.startswith("occviz.steps")):
                found.append(f"{path.name}:{line} imports {name}")
    assert found == []
