"""Spec → IR₀: the program whose meaning *is* the spec.

Each statement becomes one `Def` that loops over its left-hand indices.  Index extents are
inferred from the dimensions they index (an index used for two different sizes is an error).
"""
from __future__ import annotations

from .errors import SpecError, did_you_mean
from .names import name_problem
from .ir import (
    Or, Aff, Bin, Cond, Const, DataCond, DataRead, Def, Expr, Ext, IndexValue, Loop, Program, Read, Reduce,
    Select, Softmax, TensorType, Un, fresh,
)
from .parse import (
    PAff, PBin, PCall, PCond, PIntRead, POr, PExpr, PName, PNum, PRead, PReduce, PStatement, PWhere,
    ParseError, parse_statement,
)
from .spec import INT_DTYPES, SpecFile, param_value


# Points of the largest loop nest × reduction of IR₀ that a numeric check may evaluate.
MAX_CHECK_POINTS = 2**27


def _check_name(where: str, name: str) -> None:
    problem = name_problem(name)
    if problem:
        raise SpecError(where, problem)


class _Lowering:
    def __init__(self, spec: SpecFile):
        self.spec = spec
        self.types: dict[str, TensorType] = {}
        # a statement that is not an output is stored as f32, or f64 in a spec with an f64 tensor
        dtypes = {d.dtype for d in spec.inputs.values()} | {spec.output.dtype_of(t) for t in spec.output.tensors()}
        self.intermediate = "f64" if "f64" in dtypes else "f32"
        _check_name("name", spec.name)
        for field, names in (("sizes", spec.sizes), ("inputs", spec.inputs), ("params", spec.params)):
            for name in names:
                _check_name(f"{field}.{name}", name)
        for name, decl in spec.inputs.items():
            for k, dim in enumerate(decl.shape):
                if dim not in spec.sizes:
                    raise SpecError(f"inputs.{name}.shape[{k}]",
                                    f"unknown size {dim!r}{did_you_mean(dim, spec.sizes)} (declared: {', '.join(spec.sizes)})")
            self.types[name] = TensorType(tuple(Aff.of(d) for d in decl.shape), decl.dtype)
        clash = set(spec.inputs) & set(spec.sizes) | set(spec.params) & (set(spec.sizes) | set(spec.inputs))
        if clash:
            raise SpecError("inputs", f"name used twice: {sorted(clash)[0]}")

    def statement(self, k: int, text: str) -> Def:
        where = f"statements[{k}]"
        try:
            st = parse_statement(text)
        except ParseError as exc:
            raise SpecError(where, f"cannot parse: {exc.shown_in(text)}") from None
        if st.tensor in self.types:
            raise SpecError(where, f"tensor {st.tensor} is already defined")
        for name in (st.tensor, *st.idx, *_bound_in(st.body)):
            problem = name_problem(name)
            if problem:
                raise SpecError(where, problem)
        for v in st.idx:
            if v in self.spec.sizes or v in self.types or v in self.spec.params:
                raise SpecError(where, f"index {v} clashes with a size, tensor or parameter name")
        extents: dict[str, str] = {}
        self._infer(st.body, extents, where, set())
        missing = [v for v in st.idx if v not in extents]
        if missing:
            raise SpecError(where, f"index {missing[0]} of {st.tensor} is not used to index any tensor, so its extent is unknown")
        body = self.expr(st.body, st, extents, where, bound=set(st.idx))
        dims = tuple(Aff.of(extents[v]) for v in st.idx)
        dtype = self.spec.output.dtype_of(st.tensor) or self.intermediate
        self.types[st.tensor] = TensorType(dims, dtype)
        return Def(
            name=st.tensor,
            type=TensorType(dims, dtype),
            loops=tuple(Loop(v, Ext.of(extents[v])) for v in st.idx),
            store=tuple(Aff.of(v) for v in st.idx),
            body=body,
        )

    def _infer(self, e: PExpr | PIntRead, extents: dict[str, str], where: str, scope: set[str]) -> None:
        if isinstance(e, (PRead, PIntRead)):
            t = self.types.get(e.tensor)
            if t is None:
                raise SpecError(where, f"unknown tensor {e.tensor!r}{did_you_mean(e.tensor, self.types)} "
                                       f"(known: {', '.join(self.types)})")
            if len(e.idx) != len(t.dims):
                raise SpecError(where, f"{e.tensor} has {len(t.dims)} dimensions, indexed with {len(e.idx)}")
            for a, dim in zip(e.idx, t.dims):
                if isinstance(a, PIntRead):  # a gathered position: its extent comes from the data
                    self._infer(a, extents, where, scope)
                    continue
                if len(a.coefs) == 1 and a.coefs[0][1] == 1 and a.const == 0:
                    v = a.coefs[0][0]
                    size = next(iter(dim.names()))
                    if v in self.spec.sizes:
                        continue
                    if extents.get(v, size) != size:
                        raise SpecError(where, f"index {v} indexes dimensions of sizes {extents[v]} and {size}")
                    extents[v] = size
        elif isinstance(e, PBin):
            self._infer(e.a, extents, where, scope)
            self._infer(e.b, extents, where, scope)
        elif isinstance(e, PCall):
            self._infer(e.a, extents, where, scope)
        elif isinstance(e, PReduce):
            self._infer(e.body, extents, where, scope | {e.var})
        elif isinstance(e, PWhere):
            self._infer(e.then, extents, where, scope)
            self._infer(e.other, extents, where, scope)

    def aff(self, a: PAff, bound: set[str], where: str) -> Aff:
        for n, _ in a.coefs:
            if n not in bound and n not in self.spec.sizes:
                raise SpecError(where, f"unknown index {n!r}{did_you_mean(n, list(bound) + list(self.spec.sizes))}")
        return Aff.build(dict(a.coefs), a.const)

    def int_read(self, r: PIntRead, bound: set[str], where: str) -> DataRead:
        """A read standing for an integer: of an i32 input, at affine indices."""
        decl = self.spec.inputs.get(r.tensor)
        if decl is None or decl.dtype not in INT_DTYPES:
            what = f"a {decl.dtype} input" if decl else "a definition" if r.tensor in self.types else "unknown"
            raise SpecError(where, f"{r.tensor}[…] is used as an index or compared in a condition, but "
                                   f"{r.tensor} is {what}: only integer inputs (dtype: i32) can be")
        if len(r.idx) != len(decl.shape):
            raise SpecError(where, f"{r.tensor} has {len(decl.shape)} dimensions, indexed with {len(r.idx)}")
        return DataRead(r.tensor, tuple(self.aff(a, bound, where) for a in r.idx), self.types[r.tensor].dims)

    def side(self, a: PAff | PIntRead, bound: set[str], where: str) -> Aff | DataRead:
        return self.int_read(a, bound, where) if isinstance(a, PIntRead) else self.aff(a, bound, where)

    def cond(self, c: PCond, bound: set[str], where: str) -> tuple[Cond | DataCond, ...]:
        """The IR keeps `<` and `<=` only: `a > b` is `b < a`, `a >= b` is `b <= a`, and
        `a == b` is `a <= b && b <= a`; a comparison reading integer data keeps `==` (one
        DataCond: `Doc[b, i] == Doc[b, j]`)."""
        lhs, rhs = self.side(c.lhs, bound, where), self.side(c.rhs, bound, where)
        if isinstance(lhs, DataRead) or isinstance(rhs, DataRead):
            if c.op not in (">", ">=", "<", "<=", "=="):
                raise SpecError(where, f"unknown comparison {c.op!r}")
            if c.op in (">", ">="):
                return (DataCond(rhs, c.op.replace(">", "<"), lhs),)
            return (DataCond(lhs, c.op, rhs),)
        if c.op in ("<", "<="):
            return (Cond(lhs, c.op, rhs),)
        if c.op in (">", ">="):
            return (Cond(rhs, c.op[0].replace(">", "<") + c.op[1:], lhs),)
        if c.op == "==":
            return (Cond(lhs, "<=", rhs), Cond(rhs, "<=", lhs))
        raise SpecError(where, f"unknown comparison {c.op!r}")

    def conds(self, cs: tuple[PCond | POr, ...], bound: set[str], where: str) -> tuple[Cond | Or, ...]:
        return tuple(x for c in cs for x in (self.disjunction(c, bound, where) if isinstance(c, POr)
                                             else self.cond(c, bound, where)))

    def disjunction(self, c: POr, bound: set[str], where: str) -> tuple[Or]:
        """One Or of comparisons; `a == b` is a conjunction, which a disjunct cannot hold."""
        parts = []
        for p in c.parts:
            one = self.cond(p, bound, where)
            if any(isinstance(x, DataCond) for x in one):
                raise SpecError(where, "a comparison of integer tensor data inside a disjunction (||) is not "
                                       "supported: a disjunction joins comparisons of indices and sizes")
            if len(one) != 1:
                raise SpecError(where, "`==` inside a disjunction (||) is not supported: write it as two "
                                       "comparisons joined by && outside any ||")
            parts.extend(one)
        return (Or(tuple(parts)),)

    def expr(self, e: PExpr, st: PStatement, extents: dict[str, str], where: str, bound: set[str]) -> Expr:
        if isinstance(e, PNum):
            return Const(e.value)
        if isinstance(e, PName):
            if e.name in self.spec.params:
                return Const(param_value(self.spec, e.name), e.name)
            if e.name in bound or e.name in self.spec.sizes:
                return IndexValue(Aff.of(e.name))
            known = list(self.spec.params) + list(self.spec.sizes) + sorted(bound)
            raise SpecError(where, f"unknown name {e.name!r}{did_you_mean(e.name, known)} "
                                   f"(parameters: {', '.join(self.spec.params) or 'none'}; sizes and indices "
                                   "are values too)")
        if isinstance(e, PRead):
            return self.read(e, bound, where)
        if isinstance(e, PBin):
            a, b = self.expr(e.a, st, extents, where, bound), self.expr(e.b, st, extents, where, bound)
            if e.op in "+-" and isinstance(a, IndexValue) and isinstance(b, IndexValue):
                return IndexValue(a.aff + b.aff if e.op == "+" else a.aff - b.aff)  # j - i: one affine value
            return Bin(e.op, a, b)
        if isinstance(e, PCall):
            return Un(e.fn, self.expr(e.a, st, extents, where, bound))
        if isinstance(e, PWhere):
            conds = self.conds(e.conds, bound, where)
            return Select(conds, self.expr(e.then, st, extents, where, bound), self.expr(e.other, st, extents, where, bound))
        if isinstance(e, PReduce):
            if e.op == "softmax" and e.var not in st.idx:
                raise SpecError(
                    where,
                    f"softmax over index {e.var}, but {st.tensor}[{', '.join(st.idx)}] has no index {e.var}",
                )
            if e.var not in extents:
                raise SpecError(where, f"reduction index {e.var} does not index any tensor")
            ext = Ext.of(extents[e.var])
            if e.op == "softmax":
                return self.softmax(e, st, extents, where, bound, ext)
            if e.var in bound:
                raise SpecError(where, f"reduction index {e.var} is already bound")
            inner = bound | {e.var}
            body = self.expr(e.body, st, extents, where, inner)
            if e.guard:
                neutral = Const(0.0) if e.op == "sum" else Const(float("-inf"))
                body = Select(self.conds(e.guard, inner, where), body, neutral)
            return Reduce(e.op, e.var, ext, body)
        raise SpecError(where, f"unsupported expression {e!r}")

    def read(self, e: PRead, bound: set[str], where: str) -> Expr:
        """A read; an integer tensor as a value is refused (i32 inputs are indices and mask data).
        A gathered position `X[r, T[r]]` is the sum over that dimension of the element where its
        index equals the data, sum(g | g == T[r]: X[r, g]): the element when T[r] is in range,
        0 when it is not (no element matches)."""
        decl = self.spec.inputs.get(e.tensor)
        if decl is not None and decl.dtype in INT_DTYPES:
            raise SpecError(where, f"the integer input {e.tensor} is read as a value: an i32 tensor is read only "
                                   f"as an index (X[r, {e.tensor}[r]]) or in a condition ({e.tensor}[…] == …)")
        idx: list[Aff] = []
        gathers: list[tuple[str, Ext, DataRead]] = []
        taken = bound | set(self.spec.sizes) | set(self.types) | set(self.spec.params)
        for k, a in enumerate(e.idx):
            if isinstance(a, PIntRead):
                var = fresh(f"g_{e.tensor}".lower(),
                            taken | {v for v, _, _ in gathers})
                gathers.append((var, Ext.of(self.types[e.tensor].dims[k], 1), self.int_read(a, bound, where)))
                idx.append(Aff.of(var))
            else:
                idx.append(self.aff(a, bound, where))
        out: Expr = Read(e.tensor, tuple(idx))
        for var, ext, data in reversed(gathers):
            out = Reduce("sum", var, ext, Select((DataCond(Aff.of(var), "==", data),), out, Const(0.0)))
        return out

    def softmax(self, e: PReduce, st: PStatement, extents: dict[str, str], where: str, bound: set[str], ext: Ext) -> Expr:
        if e.var not in st.idx:
            raise SpecError(
                where,
                f"softmax over index {e.var}, but {st.tensor}[{', '.join(st.idx)}] has no index {e.var}",
            )
        inner_var = e.var + "_"
        while inner_var in bound:
            inner_var += "_"
        body = self.expr(e.body, st, extents, where, bound)
        from .ir import subst_index

        score = subst_index(body, e.var, Aff.of(inner_var))
        mask = tuple(c.subst(e.var, Aff.of(inner_var)) for c in self.conds(e.guard, bound, where))
        return Softmax(inner_var, ext, score, Aff.of(e.var), mask)


def lower_spec(spec: SpecFile) -> Program:
    """IR₀ of a validated spec."""
    low = _Lowering(spec)
    defs = tuple(low.statement(k, text) for k, text in enumerate(spec.statements))
    names = [d.name for d in defs]
    if spec.output.tensor not in names:
        raise SpecError("output.tensor", f"{spec.output.tensor!r} is not defined by any statement"
                                         f"{did_you_mean(spec.output.tensor, names)} (defined: {', '.join(names)})")
    also = [a.tensor for a in spec.output.also]
    for k, a in enumerate(also):
        if a not in names or a == spec.output.tensor or a in also[:k]:
            why = "is the main output or listed twice" if a in names else \
                f"is not defined by any statement{did_you_mean(a, names)} (defined: {', '.join(names)})"
            raise SpecError(f"output.also[{k}].tensor", f"{a!r} {why}")
    sizes = tuple((n, (None if v == "dynamic" else int(v))) for n, v in spec.sizes.items())
    inputs = tuple((n, low.types[n]) for n in spec.inputs)
    facts = (("also_outputs", ",".join(also)),) if also else ()
    prog = Program(sizes=sizes, inputs=inputs, defs=defs, output=spec.output.tensor, facts=facts)
    _check_work(spec, prog)
    if spec.variants:  # every variant's steps are checked when it is derived; here the default's
        from .schedule_variants import expand

        check_schedule(expand(spec)[0].spec, prog)
    else:
        check_schedule(spec, prog)
    return prog


def _bound_in(e: PExpr) -> list[str]:
    """Reduction indices of a parsed expression."""
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        if isinstance(x, PReduce):
            out.append(x.var)
            stack.append(x.body)
        elif isinstance(x, PBin):
            stack += [x.a, x.b]
        elif isinstance(x, PCall):
            stack.append(x.a)
        elif isinstance(x, PWhere):
            stack += [x.then, x.other]
    return out


def _check_work(spec: SpecFile, prog: Program) -> None:
    """Refuse sizes at which the float64 numeric checks could not run (memory, hours).

    The sizes are estimated as choose_check_sizes picks them: check_sizes, then fixed sizes, then
    1.5 tiles for a dynamic size a step tiles directly (an index of IR₀), 5 for the others."""
    from .checkcost import def_points
    from .ir import walk

    over: dict[tuple[str, str], str] = {}  # (definition, index of IR₀) → the size it ranges over
    for d in prog.defs:
        binders = [(lp.var, lp.ext) for lp in d.loops]
        binders += [(x.var, x.ext) for x in walk(d.body) if isinstance(x, (Reduce, Softmax))]
        for var, ext in binders:
            if len(ext.names()) == 1:
                over[(d.name, var)] = next(iter(ext.names()))
    tiles: dict[str, int] = {}
    tiled_at: dict[str, int] = {}  # the step of the largest tile on a size
    for k, step in enumerate(spec.schedule, start=1):
        raw = step.params()
        t, size = raw.get("size"), over.get((str(raw.get("def")), str(raw.get("index"))))
        if step.rule == "tile" and size and isinstance(t, int) and not isinstance(t, bool) and t > tiles.get(size, 1):
            tiles[size], tiled_at[size] = t, k
    sizes = {n: spec.check_sizes.get(n, v if v is not None else (tiles[n] * 3 // 2 + 1 if n in tiles else 5))
             for n, v in prog.sizes}

    def points(d: Def) -> int:
        return def_points(d, sizes)

    untiled = [n for n, v in prog.sizes if v is None and n not in tiles and n not in spec.check_sizes]
    if untiled and max(points(d) for d in prog.defs) > 2_000_000:  # as choose_check_sizes shrinks them
        sizes.update({n: 3 for n in untiled})
    if untiled and max(points(d) for d in prog.defs) > MAX_CHECK_POINTS:
        sizes.update({n: 2 for n in untiled})
    for d in prog.defs:
        if points(d) > MAX_CHECK_POINTS:
            shown = ", ".join(f"{n}={v}" for n, v in sizes.items())
            field = "check_sizes" if spec.check_sizes else "sizes"
            why = f"the numeric checks would evaluate about {points(d):.3g} points of {d.name} at {shown}"
            chosen = [n for n in tiles if n not in spec.check_sizes and dict(prog.sizes).get(n) is None]
            if chosen:  # a size checked at 1.5 tiles: the tile's step is what to change
                n = max(chosen, key=lambda n: tiles[n])
                k = tiled_at[n]
                raise SpecError(f"schedule[{k - 1}]", f"step {k} (tile): {why}, {n} = 1.5 tiles of {tiles[n]} + 1 "
                                                      f"(limit {MAX_CHECK_POINTS:.3g}): choose a smaller tile or "
                                                      f"check_sizes.{n}")
            raise SpecError(field, f"{why} (limit {MAX_CHECK_POINTS:.3g}); choose smaller check_sizes or fixed sizes")


def check_schedule(spec: SpecFile, prog: Program) -> None:
    """Every schedule step names a known rule with valid parameters, and every name a step
    introduces is an identifier of Coq, Lean and CUDA that no earlier name uses: checked before
    any step runs, so a typo in step 9 does not cost eight numeric checks."""
    from .errors import DerivationError
    from .ir import names_in_program
    from .rules import RULES

    taken: dict[str, str] = {n: "the spec" for n in names_in_program(prog)}
    for k, step in enumerate(spec.schedule, start=1):
        rule = RULES.get(step.rule)
        if rule is None:
            known = sorted(RULES)
            raise SpecError(f"schedule[{k - 1}].rule", f"step {k}: unknown rule {step.rule!r}"
                                                      f"{did_you_mean(step.rule, known)} (known rules: {', '.join(known)})")
        try:
            params = rule.parse_params(step.params())
        except DerivationError as exc:
            raise SpecError(f"schedule[{k - 1}]", f"step {k} ({rule.name}): {exc.reason}") from None
        for field, name in params.introduced_names(params.new_names):
            if name in taken:
                raise SpecError(f"schedule[{k - 1}].{field}",
                                f"step {k} ({rule.name}): name {name!r} is already used by {taken[name]}")
            taken[name] = f"step {k}"
