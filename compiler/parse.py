"""Parser for tensor statements in index notation.

    C[i, j] = sum(k: A[i, k] * B[k, j])
    S[b, h, i, j] = scale * sum(e: Q[b, h, i, e] * K[b, h, j, e])
    P[b, h, i, j] = softmax(j | j <= i: S[b, h, i, j])
    O[b, h, i, d] = sum(j: P[b, h, i, j] * V[b, h, j, d])

Grammar: + - * / with the usual precedence, unary minus, numbers, parameter names,
reads `T[affine, ...]`, `exp(e)`, `log(e)`, `sqrt(e)`, `rsqrt(e)`, `tanh(e)`, `erf(e)`, `max(a, b)`,
`gt(a, b)` (1 where a > b, else 0),
reductions `sum(v: e)` / `max(v: e)` with an optional guard `sum(v | cond && cond: e)`,
`softmax(v [| cond]: e)` and `where(cond, a, b)`.  A size or index name used as a value (`/ C`,
`(j - i)`) is its number.  Affine indices: `i`, `2*i + 1`, `i - j`; conditions
`a < b`, `a <= b`, `a > b`, `a >= b`, `a == b`, joined with `&&`, or with `||` (a disjunction:
`j <= i || j < P`; one condition is a conjunction or a disjunction, never both).  A read of an
integer tensor may stand for a whole index (the gather `X[r, T[r]]`) or a whole side of a
comparison (`Doc[b, i] == Doc[b, j]`, `T[r] >= 0`).
The parser produces a small syntax tree; `lower_spec` turns it into IR.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from .errors import EXCERPT_CONTEXT, clip, excerpt

# Bounds that keep every later recursive pass (lowering, rules, interpreter, printers) far
# from Python's recursion limit: a statement is at most this long, its brackets and calls
# nest at most this deep, and its expression tree is at most this deep (a sum of n terms is n
# deep).
MAX_STATEMENT_LENGTH = 4000
MAX_NESTING = 32
MAX_EXPR_DEPTH = 100

TOKEN = re.compile(r"\s*(?:(\d+\.\d*(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)|([A-Za-z_][A-Za-z_0-9]*)|(<=|>=|==|&&|\|\||[-+*/()\[\],:<>|=]))")


FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf")
BINARY_CALLS = ("max", "gt")  # f(a, b) in a statement (max(v: e) is a reduction; rescale is derivc's own)
COMPARISONS = ("<", "<=", ">", ">=", "==")


class ParseError(Exception):
    """A statement that does not parse; `column` (1-based) is where, when known."""

    def __init__(self, reason: str, column: int | None = None):
        self.reason, self.column = reason, column
        super().__init__(reason)

    def shown_in(self, text: str) -> str:
        """The reason first, then the statement cut around the failing column."""
        text = text.rstrip()
        if self.column is None:
            return f"{self.reason}, in \"{clip(text, 2 * EXCERPT_CONTEXT)}\""
        at = "" if "column" in self.reason else f" at column {self.column}"
        return f"{self.reason}{at}, in \"{excerpt(text, self.column)}\""


@dataclass(frozen=True)
class PNum:
    value: float


@dataclass(frozen=True)
class PName:
    name: str


@dataclass(frozen=True)
class PAff:
    coefs: tuple[tuple[str, int], ...]
    const: int


@dataclass(frozen=True)
class PIntRead:
    """A read of a tensor standing for an integer (an index or a side of a comparison):
    `T[r]` in `X[r, T[r]]` or `Doc[b, i] == Doc[b, j]`; the lowering checks it is an i32 input."""

    tensor: str
    idx: tuple[PAff, ...]


@dataclass(frozen=True)
class PCond:
    lhs: "PAff | PIntRead"
    op: str
    rhs: "PAff | PIntRead"


@dataclass(frozen=True)
class POr:
    """cond || cond || ...: one guard conjunct that holds when any part does."""

    parts: tuple[PCond, ...]


@dataclass(frozen=True)
class PRead:
    tensor: str
    idx: tuple["PAff | PIntRead", ...]  # a PIntRead position: a gather, X[r, T[r]]


@dataclass(frozen=True)
class PBin:
    op: str
    a: "PExpr"
    b: "PExpr"


@dataclass(frozen=True)
class PCall:
    fn: str  # one of FUNCTIONS, or neg
    a: "PExpr"


@dataclass(frozen=True)
class PReduce:
    op: str  # sum | max | softmax
    var: str
    guard: tuple[PCond, ...]
    body: "PExpr"


@dataclass(frozen=True)
class PWhere:
    conds: tuple[PCond, ...]
    then: "PExpr"
    other: "PExpr"


PExpr = Union[PNum, PName, PRead, PBin, PCall, PReduce, PWhere]


@dataclass(frozen=True)
class PStatement:
    tensor: str
    idx: tuple[str, ...]
    body: PExpr


def tokenize(text: str) -> list[str]:
    return [tok for tok, _ in tokenize_at(text)]


def tokenize_at(text: str) -> list[tuple[str, int]]:
    """The tokens, each with the 1-based column it starts at."""
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            raise ParseError(f"unexpected character {text[col - 1]!r} at column {col}", col)
        out.append((m.group(m.lastindex), m.start(m.lastindex) + 1))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        if len(text) > MAX_STATEMENT_LENGTH:
            raise ParseError(f"statement longer than {MAX_STATEMENT_LENGTH} characters ({len(text)})")
        located = tokenize_at(text)
        self.toks = [tok for tok, _ in located]
        self.columns = [col for _, col in located]
        self.end_column = len(text.rstrip()) + 1
        self.pos = 0
        self.nesting = 0

    def column(self) -> int:
        """Where the parser stands: the column of the token it looks at (or the end)."""
        return self.columns[self.pos] if self.pos < len(self.columns) else self.end_column

    def enter(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise ParseError(f"parentheses, calls or unary minus nested deeper than {MAX_NESTING} levels")

    def peek(self, k: int = 0) -> str | None:
        i = self.pos + k
        return self.toks[i] if i < len(self.toks) else None

    def take(self, expect: str | None = None) -> str:
        tok = self.peek()
        if tok is None:
            raise ParseError(f"unexpected end, expected {expect or 'more input'}")
        if expect is not None and tok != expect:
            raise ParseError(f"expected {expect!r}, found {tok!r}")
        self.pos += 1
        return tok

    def name(self) -> str:
        tok = self.peek()
        if tok is not None and not re.fullmatch(r"[A-Za-z_]\w*", tok):
            raise ParseError(f"expected a name, found {tok!r}")
        return self.take()

    def statement(self) -> PStatement:
        tensor = self.name()
        self.take("[")
        idx = [self.name()]
        while self.peek() == ",":
            self.take(",")
            idx.append(self.name())
        self.take("]")
        self.take("=")
        body = self.expr()
        if self.peek() is not None:
            raise ParseError(f"unexpected {self.peek()!r} after the expression")
        if len(set(idx)) != len(idx):
            raise ParseError(f"repeated index on the left of {tensor}[{', '.join(idx)}]")
        return PStatement(tensor, tuple(idx), body)

    def expr(self) -> PExpr:
        self.enter()
        e = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            e = PBin(op, e, self.term())
        self.nesting -= 1
        return e

    def term(self) -> PExpr:
        e = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            e = PBin(op, e, self.factor())
        return e

    def factor(self) -> PExpr:
        if self.peek() == "-":
            self.take()
            self.enter()
            e = PCall("neg", self.factor())
            self.nesting -= 1
            return e
        return self.atom()

    def atom(self) -> PExpr:
        tok = self.peek()
        if tok is None:
            raise ParseError("unexpected end of expression")
        if tok == "(":
            self.take()
            e = self.expr()
            self.take(")")
            return e
        if re.fullmatch(r"[\d.]+(?:[eE][-+]?\d+)?", tok):
            self.take()
            return PNum(float(tok))
        name = self.name()
        if self.peek() == "[":
            self.take("[")
            idx = [self.index()]
            while self.peek() == ",":
                self.take(",")
                idx.append(self.index())
            self.take("]")
            return PRead(name, tuple(idx))
        if self.peek() == "(":
            return self.call(name)
        return PName(name)

    def call(self, fn: str) -> PExpr:
        self.take("(")
        if fn in ("sum", "max", "softmax") and self.peek(1) in (":", "|"):
            var = self.name()
            guard: tuple[PCond, ...] = ()
            if self.peek() == "|":
                self.take("|")
                guard = self.conds()
            self.take(":")
            body = self.expr()
            self.take(")")
            return PReduce(fn, var, guard, body)
        if fn in FUNCTIONS:
            a = self.expr()
            self.take(")")
            return PCall(fn, a)
        if fn in BINARY_CALLS:
            a = self.expr()
            self.take(",")
            b = self.expr()
            self.take(")")
            return PBin(fn, a, b)
        if fn == "where":
            conds = self.conds()
            self.take(",")
            a = self.expr()
            self.take(",")
            b = self.expr()
            self.take(")")
            return PWhere(conds, a, b)
        raise ParseError(
            f"unknown function {fn!r} (known: sum(v: e), max(v: e), max(a, b), gt(a, b), "
            + ", ".join(f"{f}(e)" for f in FUNCTIONS) + ", softmax(v: e), where(cond, a, b))"
        )

    def conds(self) -> tuple[PCond | POr, ...]:
        out = [self.cond()]
        joins = set()
        while self.peek() in ("&&", "||"):
            joins.add(self.take())
            out.append(self.cond())
        if joins == {"&&", "||"}:
            raise ParseError("a condition joins comparisons with both && and ||: write a conjunction "
                             "(a && b) or a disjunction (a || b), not both")
        return (POr(tuple(out)),) if joins == {"||"} else tuple(out)

    def cond(self) -> PCond:
        lhs = self.index()
        op = self.take()
        if op not in COMPARISONS:
            raise ParseError(f"expected one of {' '.join(COMPARISONS)} in a condition, found {op!r}")
        return PCond(lhs, op, self.index())

    def index(self) -> "PAff | PIntRead":
        """An affine index expression, or a whole read of an (integer) tensor at affine indices."""
        tok = self.peek()
        if tok is None or not re.fullmatch(r"[A-Za-z_]\w*", tok) or self.peek(1) != "[":
            return self.aff()
        tensor = self.take()
        self.take("[")
        idx = [self.aff()]
        while self.peek() == ",":
            self.take(",")
            idx.append(self.aff())
        self.take("]")
        if self.peek() in ("+", "-", "*"):
            raise ParseError(f"arithmetic on the read of {tensor}: a tensor read used as an index or compared "
                             "in a condition stands alone (write the offset on the other side)")
        return PIntRead(tensor, tuple(idx))

    def aff(self) -> PAff:
        coefs: dict[str, int] = {}
        const = 0
        sign = 1
        if self.peek() == "-":
            self.take()
            sign = -1
        while True:
            c, n = self.aff_term()
            if n is None:
                const += sign * c
            else:
                coefs[n] = coefs.get(n, 0) + sign * c
            if self.peek() in ("+", "-"):
                sign = 1 if self.take() == "+" else -1
                continue
            break
        return PAff(tuple(sorted(coefs.items())), const)

    def aff_term(self) -> tuple[int, str | None]:
        tok = self.take()
        if tok.isdigit():
            if self.peek() == "*":
                self.take("*")
                return int(tok), self.name()
            return int(tok), None
        if re.fullmatch(r"[A-Za-z_]\w*", tok):
            if self.peek() == "[":
                raise ParseError(f"a read of {tok} inside an affine expression: a tensor read used as an index "
                                 "or compared in a condition stands alone (its indices are affine)")
            if self.peek() == "*":
                self.take("*")
                k = self.take()
                if not k.isdigit():
                    raise ParseError(f"index expressions must be affine: {tok}*{k}")
                return int(k), tok
            return 1, tok
        raise ParseError(f"expected an index term, found {tok!r}")


def expr_depth(e: PExpr) -> int:
    """Depth of an expression tree (iterative: the tree may be deeper than the stack)."""
    best, stack = 0, [(e, 1)]
    while stack:
        x, d = stack.pop()
        best = max(best, d)
        if isinstance(x, PBin):
            stack += [(x.a, d + 1), (x.b, d + 1)]
        elif isinstance(x, (PCall, PReduce)):
            stack.append((x.a if isinstance(x, PCall) else x.body, d + 1))
        elif isinstance(x, PWhere):
            stack += [(x.then, d + 1), (x.other, d + 1)]
    return best


def parse_statement(text: str) -> PStatement:
    parser = _Parser(text)
    try:
        st = parser.statement()
    except ParseError as exc:
        if exc.column is None:
            exc.column = parser.column()
        raise
    depth = expr_depth(st.body)
    if depth > MAX_EXPR_DEPTH:
        raise ParseError(f"expression {depth} levels deep (limit {MAX_EXPR_DEPTH}; a sum of n terms is n deep): "
                         "split it into several statements")
    return st
