"""Step scripts: one step a line (`T1: update test set value = 11 where id = 1`), parsed by a grammar of their own.

The statements go to a real database, so nothing passes but what this grammar describes:
transaction control, and `select` / `update` / `insert` / `delete` on the one table `test`
(columns id, value, version) with integer expressions. No strings, no functions, no other
table, no second statement after a `;` (except Hermitage's `begin; set transaction isolation
level X`). A statement is parsed into a small tree and the SQL sent is rendered from it
(`render`), never the text as written.

    rows: 1=10 2=20                       the initial rows (optional; Hermitage's by default)
    T1: begin isolation level repeatable read
    T1: select * from test where id = 1
    T2: update test set value = value + 1, version = version + 1 where id = 1 and version = 1
    # a comment; -- one too, also after a step

`parse(text)` returns a `Script` or raises `ScriptError` naming the line and what is wrong.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

MAX_STEPS = 200
MAX_LINE = 400
MAX_TEXT = 40_000
MAX_ROWS = 20
ACTORS = ("T1", "T2", "T3", "T4")
MIN_ACTORS = 2
INT_MAX = 2**31 - 1
COLUMNS = ("id", "value", "version")
DEFAULT_ROWS: tuple[tuple[int, int], ...] = ((1, 10), (2, 20))
"""Hermitage's rows: `insert into test (id, value) values (1, 10), (2, 20)`."""
ISOLATION_LEVELS = ("read uncommitted", "read committed", "repeatable read", "serializable")


class ScriptError(ValueError):
    """A script that cannot run: the message names the line and what is wrong ("line 3: ...")."""

    def __init__(self, line: int | None, message: str) -> None:
        self.line = line
        self.reason = message
        super().__init__(f"line {line}: {message}" if line is not None else message)


class StepKind(enum.StrEnum):
    """What a step does, as a class is taught to tell them apart."""

    BEGIN = "begin"
    READ = "read"
    PREDICATE_READ = "predicate read"
    LOCKING_READ = "locking read"
    BLIND_WRITE = "write"
    CAS_WRITE = "compare-and-swap"
    INSERT = "insert"
    DELETE = "delete"
    COMMIT = "commit"
    ABORT = "abort"

    @property
    def writes(self) -> bool:
        return self in (StepKind.BLIND_WRITE, StepKind.CAS_WRITE, StepKind.INSERT, StepKind.DELETE)

    @property
    def reads(self) -> bool:
        return self in (StepKind.READ, StepKind.PREDICATE_READ, StepKind.LOCKING_READ)


# -- expressions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    value: int
    boolean = False


@dataclass(frozen=True)
class Column:
    name: str
    boolean = False


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "not"
    operand: Expr

    @property
    def boolean(self) -> bool:
        return self.op == "not"


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / %  = <> < <= > >=  and or
    left: Expr
    right: Expr

    @property
    def boolean(self) -> bool:
        return self.op not in _ARITHMETIC


@dataclass(frozen=True)
class InList:
    operand: Expr
    items: tuple[Expr, ...]
    negated: bool = False
    boolean = True


Expr = Number | Column | Unary | Binary | InList

_ARITHMETIC = ("+", "-", "*", "/", "%")
_COMPARISONS = ("=", "<>", "!=", "<", "<=", ">", ">=")


def columns_of(expr: Expr | None) -> set[str]:
    """The columns an expression names."""
    if expr is None or isinstance(expr, Number):
        return set()
    if isinstance(expr, Column):
        return {expr.name}
    if isinstance(expr, Unary):
        return columns_of(expr.operand)
    if isinstance(expr, Binary):
        return columns_of(expr.left) | columns_of(expr.right)
    return columns_of(expr.operand).union(*(columns_of(item) for item in expr.items))


def evaluate(expr: Expr, row: dict[str, int]) -> int | bool | None:
    """The expression's value on `row` as SQL computes it (integer division truncates), None for a division by zero."""
    if isinstance(expr, Number):
        return expr.value
    if isinstance(expr, Column):
        return row[expr.name]
    if isinstance(expr, Unary):
        inner = evaluate(expr.operand, row)
        if inner is None:
            return None
        return (not inner) if expr.op == "not" else -int(inner)
    if isinstance(expr, InList):
        found = evaluate(expr.operand, row)
        values = [evaluate(item, row) for item in expr.items]
        if found is None:
            return None
        return (found in values) != expr.negated
    left, right = evaluate(expr.left, row), evaluate(expr.right, row)
    if expr.op == "and":
        return None if left is None or right is None else bool(left and right)
    if expr.op == "or":
        return None if left is None or right is None else bool(left or right)
    if left is None or right is None:
        return None
    a, b = int(left), int(right)
    match expr.op:
        case "+":
            return a + b
        case "-":
            return a - b
        case "*":
            return a * b
        case "/" | "%":
            if b == 0:
                return None
            quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
            return quotient if expr.op == "/" else a - b * quotient
        case "=":
            return a == b
        case "<>" | "!=":
            return a != b
        case "<":
            return a < b
        case "<=":
            return a <= b
        case ">":
            return a > b
        case _:
            return a >= b


# -- statements --------------------------------------------------------------------------


@dataclass(frozen=True)
class Begin:
    isolation: str | None = None


@dataclass(frozen=True)
class Commit:
    pass


@dataclass(frozen=True)
class Abort:
    pass


@dataclass(frozen=True)
class Select:
    where: Expr | None = None
    lock: str | None = None  # "update" or "share"


@dataclass(frozen=True)
class Update:
    assignments: tuple[tuple[str, Expr], ...]
    where: Expr | None = None


@dataclass(frozen=True)
class Insert:
    columns: tuple[str, ...]
    rows: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Delete:
    where: Expr | None = None


Statement = Begin | Commit | Abort | Select | Update | Insert | Delete


def classify(statement: Statement) -> StepKind:
    match statement:
        case Begin():
            return StepKind.BEGIN
        case Commit():
            return StepKind.COMMIT
        case Abort():
            return StepKind.ABORT
        case Select(where=where, lock=lock):
            if lock:
                return StepKind.LOCKING_READ
            return StepKind.PREDICATE_READ if columns_of(where) - {"id"} else StepKind.READ
        case Update(where=where):
            return StepKind.CAS_WRITE if "version" in columns_of(where) else StepKind.BLIND_WRITE
        case Insert():
            return StepKind.INSERT
        case _:
            return StepKind.DELETE


@dataclass(frozen=True)
class Step:
    line: int
    actor: str
    text: str
    """The statement as written (without its `;` and comment), words separated by single spaces."""
    statement: Statement
    kind: StepKind

    @property
    def number(self) -> int:
        """The actor's number: 1 for T1."""
        return ACTORS.index(self.actor) + 1


@dataclass(frozen=True)
class Script:
    steps: tuple[Step, ...]
    actors: tuple[str, ...]
    rows: tuple[tuple[int, int], ...] = DEFAULT_ROWS
    """The initial rows, (id, value), each at version 1."""
    steps_of: dict[str, tuple[Step, ...]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for actor in self.actors:
            self.steps_of[actor] = tuple(step for step in self.steps if step.actor == actor)


# -- rendering ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SqlFlavor:
    """How a database spells what differs: PostgreSQL's by default."""

    share_lock: str = "FOR SHARE"
    divide: str = "/"


POSTGRES = SqlFlavor()
_SELECTED = "SELECT id, value, version FROM test"


def render_expr(expr: Expr, flavor: SqlFlavor = POSTGRES) -> str:
    if isinstance(expr, Number):
        return str(expr.value)
    if isinstance(expr, Column):
        return expr.name
    if isinstance(expr, Unary):
        inner = render_expr(expr.operand, flavor)
        return f"(NOT {inner})" if expr.op == "not" else f"(-{inner})"
    if isinstance(expr, InList):
        items = ", ".join(render_expr(item, flavor) for item in expr.items)
        return f"({render_expr(expr.operand, flavor)} {'NOT IN' if expr.negated else 'IN'} ({items}))"
    op = {"!=": "<>", "and": "AND", "or": "OR", "/": flavor.divide}.get(expr.op, expr.op)
    return f"({render_expr(expr.left, flavor)} {op} {render_expr(expr.right, flavor)})"


def _where(where: Expr | None, flavor: SqlFlavor) -> str:
    return "" if where is None else f" WHERE {render_expr(where, flavor)}"


def render(statement: Statement, flavor: SqlFlavor = POSTGRES) -> str:
    """The SQL for a data statement (select, update, insert, delete); transaction control is the dialect's."""
    match statement:
        case Select(where=where, lock=lock):
            locking = {"update": " FOR UPDATE", "share": f" {flavor.share_lock}"}.get(lock or "", "")
            return f"{_SELECTED}{_where(where, flavor)}{locking}"
        case Update(assignments=assignments, where=where):
            sets = ", ".join(f"{column} = {render_expr(value, flavor)}" for column, value in assignments)
            return f"UPDATE test SET {sets}{_where(where, flavor)}"
        case Insert(columns=columns, rows=rows):
            values = ", ".join("(" + ", ".join(map(str, row)) + ")" for row in rows)
            return f"INSERT INTO test ({', '.join(columns)}) VALUES {values}"
        case Delete(where=where):
            return f"DELETE FROM test{_where(where, flavor)}"
    raise ValueError(f"not a data statement: {statement!r}")


# -- tokens ------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<number>[0-9]+)|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<op><>|!=|<=|>=|[=<>+\-*/%(),;]))")


@dataclass(frozen=True)
class Token:
    kind: str  # "number", "word", "op"
    text: str


def tokenize(text: str) -> list[Token]:
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            bad = text[position:].lstrip()[:1]
            if bad in ("'", '"', "$"):
                raise ValueError("strings and quoted names are not part of a step (integers only)")
            raise ValueError(f"unexpected character {bad!r}")
        kind = match.lastgroup or ""
        word = match[kind]
        tokens.append(Token(kind, word.lower() if kind == "word" else word))
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent over one statement's tokens; ValueError says what was expected."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self, offset: int = 0) -> Token | None:
        index = self.at + offset
        return self.tokens[index] if index < len(self.tokens) else None

    def accept(self, *texts: str) -> str | None:
        token = self.peek()
        if token is not None and token.kind != "number" and token.text in texts:
            self.at += 1
            return token.text
        return None

    def expect(self, *texts: str) -> str:
        found = self.accept(*texts)
        if found is None:
            raise ValueError(f"expected {' or '.join(repr(t) for t in texts)}, found {self.describe()}")
        return found

    def describe(self) -> str:
        token = self.peek()
        return "the end of the line" if token is None else repr(token.text)

    def end(self) -> None:
        ended = self.accept(";")
        if self.peek() is None:
            return
        if ended:
            raise ValueError("one statement a step: nothing may follow ';'")
        raise ValueError(f"unexpected {self.describe()} after the statement")

    # statements

    def statement(self) -> Statement:
        word = self.peek()
        if word is None:
            raise ValueError("a step needs a statement after the actor's name")
        if word.kind != "word":
            raise ValueError(f"unknown statement starting with {word.text!r}")
        handlers: dict[str, Callable[[], Statement]] = {
            "begin": self.begin,
            "start": self.begin,
            "commit": self.commit,
            "end": self.commit,
            "abort": self.abort,
            "rollback": self.abort,
            "select": self.select,
            "update": self.update,
            "insert": self.insert,
            "delete": self.delete,
        }
        handler = handlers.get(word.text)
        if handler is None:
            raise ValueError(
                f"unknown statement {word.text!r} (begin, commit, abort or rollback, select, update, insert, delete)"
            )
        statement = handler()
        self.end()
        return statement

    def level(self) -> str:
        self.expect("isolation")
        self.expect("level")
        first = self.expect("read", "repeatable", "serializable")
        if first == "read":
            return "read " + self.expect("committed", "uncommitted")
        if first == "repeatable":
            self.expect("read")
            return "repeatable read"
        return "serializable"

    def begin(self) -> Begin:
        if self.expect("begin", "start") == "start":
            self.expect("transaction")
        else:
            self.accept("transaction", "work")
        token = self.peek()
        isolation = self.level() if token is not None and token.text == "isolation" else None
        # Hermitage's form: `begin; set transaction isolation level X`.
        following = self.peek(1)
        if isolation is None and self.accept(";") and following is not None:
            self.expect("set")
            self.expect("transaction")
            isolation = self.level()
        return Begin(isolation)

    def commit(self) -> Commit:
        self.expect("commit", "end")
        self.accept("transaction", "work")
        return Commit()

    def abort(self) -> Abort:
        self.expect("abort", "rollback")
        self.accept("transaction", "work")
        return Abort()

    def table(self) -> None:
        token = self.peek()
        if token is None or token.text != "test":
            raise ValueError(f"the table is test, not {self.describe()}")
        self.at += 1

    def column(self) -> str:
        token = self.peek()
        if token is None or token.kind != "word" or token.text not in COLUMNS:
            raise ValueError(f"expected a column (id, value, version), found {self.describe()}")
        self.at += 1
        return token.text

    def column_list(self) -> tuple[str, ...]:
        columns = [self.column()]
        while self.accept(","):
            columns.append(self.column())
        if len(set(columns)) != len(columns):
            raise ValueError("a column is named twice")
        return tuple(columns)

    def where(self) -> Expr | None:
        if not self.accept("where"):
            return None
        condition = self.expr()
        if not condition.boolean:
            raise ValueError("the where clause must be a condition (a comparison), not a number")
        return condition

    def select(self) -> Select:
        self.expect("select")
        if not self.accept("*"):
            self.column_list()  # every read returns id, value and version: the columns named only select what is shown
        self.expect("from")
        self.table()
        where = self.where()
        lock = None
        if self.accept("for"):
            lock = self.expect("update", "share")
        return Select(where, lock)

    def update(self) -> Update:
        self.expect("update")
        self.table()
        self.expect("set")
        assignments = []
        while True:
            name = self.column()
            if name == "id":
                raise ValueError("update sets value or version, not id")
            self.expect("=")
            value = self.expr()
            if value.boolean:
                raise ValueError(f"{name} must be set to a number, not a condition")
            assignments.append((name, value))
            if not self.accept(","):
                break
        if len({name for name, _ in assignments}) != len(assignments):
            raise ValueError("a column is set twice")
        return Update(tuple(assignments), self.where())

    def insert(self) -> Insert:
        self.expect("insert")
        self.expect("into")
        self.table()
        self.expect("(")
        columns = self.column_list()
        self.expect(")")
        missing = [name for name in ("id", "value") if name not in columns]
        if missing:
            raise ValueError(f"insert needs {' and '.join(missing)} (every row has an id and a value)")
        self.expect("values")
        rows = [self.values(len(columns))]
        while self.accept(","):
            rows.append(self.values(len(columns)))
        if len(rows) > MAX_ROWS:
            raise ValueError(f"at most {MAX_ROWS} rows in one insert")
        return Insert(columns, tuple(rows))

    def values(self, count: int) -> tuple[int, ...]:
        self.expect("(")
        values = [self.integer()]
        while self.accept(","):
            values.append(self.integer())
        self.expect(")")
        if len(values) != count:
            raise ValueError(f"{len(values)} values for {count} columns")
        return tuple(values)

    def integer(self) -> int:
        negative = bool(self.accept("-"))
        token = self.peek()
        if token is None or token.kind != "number":
            raise ValueError(f"expected an integer, found {self.describe()}")
        self.at += 1
        return -_bounded(token.text) if negative else _bounded(token.text)

    def delete(self) -> Delete:
        self.expect("delete")
        self.expect("from")
        self.table()
        return Delete(self.where())

    # expressions

    def expr(self) -> Expr:
        left = self.conjunction()
        while self.accept("or"):
            left = self.logical("or", left, self.conjunction())
        return left

    def conjunction(self) -> Expr:
        left = self.negation()
        while self.accept("and"):
            left = self.logical("and", left, self.negation())
        return left

    @staticmethod
    def logical(op: str, left: Expr, right: Expr) -> Expr:
        if not (left.boolean and right.boolean):
            raise ValueError(f"'{op}' joins conditions, not numbers")
        return Binary(op, left, right)

    def negation(self) -> Expr:
        if self.accept("not"):
            operand = self.negation()
            if not operand.boolean:
                raise ValueError("'not' applies to a condition, not a number")
            return Unary("not", operand)
        return self.comparison()

    def comparison(self) -> Expr:
        left = self.additive()
        token = self.peek()
        if token is not None and token.kind == "op" and token.text in _COMPARISONS:
            self.at += 1
            right = self.additive()
            if left.boolean or right.boolean:
                raise ValueError(f"'{token.text}' compares numbers, not conditions")
            return Binary(token.text, left, right)
        negated = False
        if token is not None and token.text == "not" and (following := self.peek(1)) and following.text == "in":
            self.at += 1
            negated = True
        if self.accept("in"):
            if left.boolean:
                raise ValueError("'in' tests a number, not a condition")
            self.expect("(")
            items = [self.additive()]
            while self.accept(","):
                items.append(self.additive())
            self.expect(")")
            if any(item.boolean for item in items):
                raise ValueError("an 'in' list holds numbers")
            return InList(left, tuple(items), negated)
        return left

    def additive(self) -> Expr:
        left = self.term()
        while (op := self.accept("+", "-")) is not None:
            left = self.arithmetic(op, left, self.term())
        return left

    def term(self) -> Expr:
        left = self.unary()
        while (op := self.accept("*", "/", "%")) is not None:
            left = self.arithmetic(op, left, self.unary())
        return left

    @staticmethod
    def arithmetic(op: str, left: Expr, right: Expr) -> Expr:
        if left.boolean or right.boolean:
            raise ValueError(f"'{op}' works on numbers, not conditions")
        return Binary(op, left, right)

    def unary(self) -> Expr:
        if self.accept("-"):
            operand = self.unary()
            if operand.boolean:
                raise ValueError("'-' applies to a number")
            return Unary("-", operand)
        return self.primary()

    def primary(self) -> Expr:
        token = self.peek()
        if token is None:
            raise ValueError("the expression ends too soon")
        if token.kind == "number":
            self.at += 1
            return Number(_bounded(token.text))
        if self.accept("("):
            inner = self.expr()
            self.expect(")")
            return inner
        if token.kind == "word" and token.text in COLUMNS:
            self.at += 1
            return Column(token.text)
        if token.kind == "word":
            following = self.peek(1)
            if following is not None and following.text == "(":
                raise ValueError(f"functions are not part of a step ({token.text}(...))")
            raise ValueError(f"unknown column {token.text!r} (the columns are id, value, version)")
        raise ValueError(f"expected a number, a column or '(', found {token.text!r}")


def _bounded(digits: str) -> int:
    value = int(digits)
    if value > INT_MAX:
        raise ValueError(f"{digits} is too large (integers up to {INT_MAX})")
    return value


def parse_statement(text: str) -> tuple[Statement, StepKind]:
    """One statement (without its actor), or ValueError saying what is wrong."""
    statement = _Parser(tokenize(text)).statement()
    return statement, classify(statement)


_ACTOR = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)\s*:(.*)$", re.DOTALL)
_ROWS = re.compile(r"^\s*rows\s*:(.*)$", re.IGNORECASE | re.DOTALL)
_ROW = re.compile(r"^(-?[0-9]{1,10})=(-?[0-9]{1,10})$")


def _without_comment(line: str) -> str:
    cut = [index for index in (line.find("--"), line.find("#")) if index >= 0]
    return line[: min(cut)] if cut else line


def _rows(raw: str, number: int) -> tuple[tuple[int, int], ...]:
    rows: dict[int, int] = {}
    for word in raw.replace(",", " ").split():
        found = _ROW.match(word)
        if found is None:
            raise ScriptError(number, f"{word!r} is not ID=VALUE (rows: 1=10 2=20)")
        row_id, value = int(found[1]), int(found[2])
        if abs(row_id) > INT_MAX or abs(value) > INT_MAX:
            raise ScriptError(number, f"{word!r}: integers up to {INT_MAX}")
        if row_id in rows:
            raise ScriptError(number, f"row {row_id} is given twice")
        rows[row_id] = value
    if len(rows) > MAX_ROWS:
        raise ScriptError(number, f"at most {MAX_ROWS} rows")
    return tuple(sorted(rows.items()))


def _lines(text: str) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(text.splitlines(), start=1):
        if len(raw) > MAX_LINE:
            raise ScriptError(number, f"a line of {len(raw)} characters (at most {MAX_LINE})")
        if not raw.isascii() or any(ord(c) < 32 and c != "\t" for c in raw):
            raise ScriptError(number, "only plain ASCII characters are part of a step")
        line = _without_comment(raw).strip()
        if line:
            yield number, line


def parse(text: str) -> Script:
    """The script in `text`, or ScriptError naming the first line that is wrong."""
    if len(text) > MAX_TEXT:
        raise ScriptError(None, f"a script of {len(text)} characters (at most {MAX_TEXT})")
    steps: list[Step] = []
    rows: tuple[tuple[int, int], ...] | None = None
    for number, line in _lines(text):
        rows_line = _ROWS.match(line)
        if rows_line is not None:
            if rows is not None or steps:
                raise ScriptError(number, "the rows are given once, before the first step")
            rows = _rows(rows_line[1], number)
            continue
        found = _ACTOR.match(line)
        if found is None:
            raise ScriptError(number, f"a step is ACTOR: STATEMENT (e.g. T1: begin), not {line[:60]!r}")
        actor = found[1].upper()
        if actor not in ACTORS:
            raise ScriptError(number, f"{found[1]} is not an actor ({ACTORS[0]} to {ACTORS[-1]})")
        body = " ".join(found[2].split())
        try:
            statement, kind = parse_statement(body)
        except ValueError as wrong:
            raise ScriptError(number, f"{wrong} in {body[:80]!r}") from None
        steps.append(Step(number, actor, body.rstrip(";").rstrip(), statement, kind))
        if len(steps) > MAX_STEPS:
            raise ScriptError(number, f"more than {MAX_STEPS} steps")
    if not steps:
        raise ScriptError(None, "the script has no steps (one a line, e.g. T1: begin)")
    used = sorted({step.actor for step in steps}, key=ACTORS.index)
    if len(used) < MIN_ACTORS:
        raise ScriptError(None, f"a script needs {MIN_ACTORS} to {len(ACTORS)} actors; it has only {used[0]}")
    expected = ACTORS[: len(used)]
    if tuple(used) != expected:
        first_gap = next(step for step in steps if step.actor not in expected)
        raise ScriptError(
            first_gap.line,
            f"the actors are {', '.join(used)}: number them {', '.join(expected)} (from T1, without gaps)",
        )
    return Script(tuple(steps), expected, rows if rows is not None else DEFAULT_ROWS)


def script_text(steps: Sequence[tuple[str, str]], rows: Sequence[tuple[int, int]] | None = None) -> str:
    """A script's text from (actor, statement) pairs: how built-in scripts are written."""
    head = [f"rows: {' '.join(f'{i}={v}' for i, v in rows)}"] if rows is not None else []
    return "\n".join([*head, *(f"{actor}: {statement}" for actor, statement in steps)])


@dataclass(frozen=True)
class BuiltinScript:
    """A script shipped with occviz: its name, title and the question to ask before stepping it."""

    name: str
    title: str
    question: str
    """One line to ask the class before the first step."""
    text: str
    isolation: str = "read committed"
    """The level its begin-less actors (and plain `begin`s) use unless the form says otherwise."""

    @property
    def script(self) -> Script:
        return parse(self.text)
