"""What every rule is: a named, parameterised, checked rewrite of a Program.

A rule module defines one `Rule` subclass with
- `name` (the schedule's `rule:` value) and `kind` (one of the eight rule kinds + MAP-MMA),
- `theorem`: the name of its soundness theorem in lean/ and proofs_ci/coq/ (the same name),
- `Params`: a pydantic model of the step's parameters,
- `check(program, params) -> Facts`: the precondition; raises `DerivationError` with a reason,
- `rewrite(program, params, facts) -> Program`: the new program (meaning unchanged).
The `facts` dict records what the check established (shown in derivation.json and report.md);
`site` in it names the rewritten node for the proof obligation exporter.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Iterator

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import DerivationError, StepInputError, did_you_mean
from ..names import name_problem
from ..ir import (
    Aff, Def, Expr, Ext, Fold, Let, Program, Reduce, Softmax, all_binders, bound_here, map_children, walk,
)

Facts = dict[str, Any]


class StepParams(BaseModel):
    # strict: `size: true`, `size: "128"` and `size: 2.0` are refused, not coerced; each field's
    # docstring is its description (the rule reference, docs/rules.md, is generated from them)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)
    # Parameters that name something the step introduces: exact names (must be new) and name
    # bases (made unique by the rule); both reach the Coq, Lean and CUDA sources verbatim.
    new_names: ClassVar[tuple[str, ...]] = ()
    name_bases: ClassVar[tuple[str, ...]] = ()

    def introduced_names(self, fields: tuple[str, ...]) -> list[tuple[str, str]]:
        """(parameter as written, value) for every name given in `fields`."""
        out: list[tuple[str, str]] = []
        for f in fields:
            value = getattr(self, f)
            alias = type(self).model_fields[f].alias or f
            if isinstance(value, str):
                out.append((alias, value))
            elif isinstance(value, tuple):
                out.extend((f"{alias}[{k}]", v) for k, v in enumerate(value))
        return out


class Rule:
    name: ClassVar[str]
    kind: ClassVar[str]
    theorem: ClassVar[str]
    also: ClassVar[tuple[str, ...]] = ()  # further theorems a step of this rule may cite
    Params: ClassVar[type[StepParams]]

    def parse_params(self, raw: dict[str, Any]) -> StepParams:
        try:
            params = self.Params.model_validate({k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
        except ValidationError as exc:
            errors = exc.errors()
            err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # a typo first
            loc = ".".join(str(x) for x in err["loc"]) or "parameters"
            msg = "unknown parameter" if err["type"] == "extra_forbidden" else err["msg"]
            names = [f.alias or n for n, f in self.Params.model_fields.items()]
            hint = did_you_mean(loc, names) if err["type"] == "extra_forbidden" else ""
            raise DerivationError(
                self.name, f"parameter {loc}: {msg}{hint} (parameters of {self.name}: {', '.join(names)})"
            ) from None
        for field, value in params.introduced_names(params.new_names + params.name_bases):
            problem = name_problem(value)
            if problem:
                raise DerivationError(self.name, f"parameter {field}: {problem}")
        return params

    def check(self, prog: Program, params: Any) -> Facts:
        raise NotImplementedError

    def rewrite(self, prog: Program, params: Any, facts: Facts) -> Program:
        raise NotImplementedError

    def fail(self, reason: str) -> DerivationError:
        return DerivationError(self.name, reason)

    # ------------------------------------------------------------------ helpers for rules

    def unknown(self, reason: str) -> StepInputError:
        """The step names something that does not exist, or a name already taken (exit 2)."""
        return StepInputError(self.name, reason)

    def get_def(self, prog: Program, name: str, field: str = "def") -> Def:
        if not prog.has_def(name):
            known = [d.name for d in prog.defs]
            raise self.unknown(f"parameter {field}: no definition named {name!r}{did_you_mean(name, known)} "
                               f"(defined: {', '.join(known)})")
        return prog.def_named(name)

    def require_index(self, d: Def, name: str, field: str) -> None:
        """`name` is a loop or bound index of d; else an input error listing the ones d has now
        (after TILE's renames the original name is gone)."""
        loops = [lp.var for lp in d.loops]
        inner = [v for v in binder_names(d) if v not in loops]
        if name in loops or name in inner or name in all_binders(d.body):
            return
        if any(name in {v for v, _ in b.dims} for x in walk(d.body) if isinstance(x, Fold) for b in x.binds):
            return
        now = f"loops now: {', '.join(loops) or 'none'}; bound inside: {', '.join(inner) or 'none'}"
        raise self.unknown(f"parameter {field}: index {name!r} is not bound in {d.name}"
                           f"{did_you_mean(name, loops + inner)} ({now})")

    def require_new_name(self, prog: Program, name: str, field: str) -> None:
        from ..ir import names_in_program

        if name in names_in_program(prog):
            raise self.unknown(f"parameter {field}: name {name} is already used in the program")


def binder_names(d: Def) -> list[str]:
    """Loop vars then every index bound inside the body, in order."""
    out = [lp.var for lp in d.loops]
    for e in walk(d.body):
        out.extend(sorted(bound_here(e)))
    return out


def find_binder(d: Def, var: str) -> Expr | None:
    """The Reduce / Softmax / Fold in d's body that binds var (None if var is a loop)."""
    for e in walk(d.body):
        if isinstance(e, (Reduce, Softmax, Fold)) and e.var == var:
            return e
    return None


def replace_node(e: Expr, target: Expr, new: Expr) -> Expr:
    """e with the node `target` (by identity) replaced by `new`."""
    if e is target:
        return new
    return map_children(e, lambda c: replace_node(c, target, new))


def enclosing_binders(root: Expr, target: Expr) -> list[Expr]:
    """The binding nodes (Reduce/Softmax/Fold/Let) on the path from root to target."""
    path: list[Expr] = []

    def go(e: Expr) -> bool:
        if e is target:
            return True
        from ..ir import children

        for c in children(e):
            if go(c):
                if isinstance(e, (Reduce, Softmax, Fold, Let)):
                    path.append(e)
                return True
        return False

    go(root)
    return list(reversed(path))


def const_extent(prog: Program, ext: Ext) -> int | None:
    """The extent's value when it depends only on fixed sizes."""
    fixed = {n: v for n, v in prog.sizes if v is not None}
    if not ext.names() <= set(fixed):
        return None
    return ext.evaluate(fixed)


def const_aff(prog: Program, a: Aff) -> int | None:
    fixed = {n: v for n, v in prog.sizes if v is not None}
    if not a.names() <= set(fixed):
        return None
    return a.evaluate(fixed)


def replace_def(prog: Program, d: Def) -> Program:
    return prog.with_def(d)


def drop_def(prog: Program, name: str) -> Program:
    return replace(prog, defs=tuple(x for x in prog.defs if x.name != name))


def readers_of(prog: Program, name: str) -> Iterator[Def]:
    from ..ir import tensors_read

    for d in prog.defs:
        if name in tensors_read(d.body):
            yield d


def guarded(conds: tuple, body: Expr, neutral: Expr) -> Expr:
    """[conds] ? body : neutral, merging with a body that is already guarded the same way."""
    from ..ir import Select

    if isinstance(body, Select) and body.other == neutral:
        return Select(tuple(conds) + body.conds, body.then, neutral)
    return Select(tuple(conds), body, neutral)


def freshen_binders(e: Expr, taken: set[str]) -> Expr:
    """e with every index it binds renamed to a name not in `taken` (taken is extended)."""
    from ..ir import Aff, Fold, Let, Reduce, Softmax, subst_index

    def new_name(v: str) -> str:
        from ..ir import fresh

        n = fresh(v, taken)
        taken.add(n)
        return n

    def go(x: Expr) -> Expr:
        x = map_children(x, go)
        if isinstance(x, Let):
            return _freshen_let(x, new_name)
        if isinstance(x, Fold):
            return _freshen_fold(x, new_name)
        if isinstance(x, Reduce):
            v = new_name(x.var)
            return replace(x, var=v, body=subst_index(x.body, x.var, Aff.of(v)))
        if isinstance(x, Softmax):
            v = new_name(x.var)
            return replace(x, var=v, score=subst_index(x.score, x.var, Aff.of(v)),
                           mask=tuple(c.subst(x.var, Aff.of(v)) for c in x.mask))
        return x

    return go(e)


def alpha_normal(e: Expr) -> Expr:
    """e with its bound indices renamed canonically (_b0, _b1, … in pre-order)."""
    counter = [0]

    def go(x: Expr) -> Expr:
        from ..ir import Reduce, Softmax

        if isinstance(x, (Reduce, Softmax)):
            v = f"_b{counter[0]}"
            counter[0] += 1
            renamed = subst_index_bound(x, v)
            return map_children(renamed, go)
        return map_children(x, go)

    return go(e)


def subst_index_bound(x: Expr, new: str) -> Expr:
    """Rename the index bound by a Reduce/Softmax node to `new`."""
    from ..ir import Aff, Reduce, Softmax, subst_index

    if isinstance(x, Reduce):
        return replace(x, var=new, body=subst_index(x.body, x.var, Aff.of(new)))
    if isinstance(x, Softmax):
        return replace(x, var=new, score=subst_index(x.score, x.var, Aff.of(new)),
                       mask=tuple(c.subst(x.var, Aff.of(new)) for c in x.mask))
    return x


def alpha_equal(a: Expr, b: Expr) -> bool:
    return alpha_normal(a) == alpha_normal(b)


def _freshen_binding(b, new_name):
    """(binding with fresh dim names, its new name)."""
    from ..ir import Aff, subst_index

    value, dims = b.value, []
    for v, x in b.dims:
        n = new_name(v)
        value = subst_index(value, v, Aff.of(n))
        dims.append((n, x))
    return replace(b, dims=tuple(dims), value=value), new_name(b.name)


def _freshen_let(x, new_name):
    from ..ir import Let, rename_tensor

    bind, name = _freshen_binding(x.bind, new_name)
    return Let(replace(bind, name=name), rename_tensor(x.body, x.bind.name, name))


def _freshen_fold(x, new_name):
    """A fold with fresh index, state and buffer names (reads renamed to match)."""
    from ..ir import Aff, rename_tensor, subst_index

    var = new_name(x.var)
    binds = [replace(b, value=subst_index(b.value, x.var, Aff.of(var))) for b in x.binds]
    update = [subst_index(u, x.var, Aff.of(var)) for u in x.update]
    result = x.result
    renames = [(s, new_name(s)) for s in x.state]
    fresh_binds = []
    for b in binds:
        nb, name = _freshen_binding(b, new_name)
        fresh_binds.append(replace(nb, name=name))
        renames.append((b.name, name))
    for old, new in renames:
        fresh_binds = [replace(b, value=rename_tensor(b.value, old, new)) for b in fresh_binds]
        update = [rename_tensor(u, old, new) for u in update]
        result = rename_tensor(result, old, new)
    state = tuple(new for _, new in renames[: len(x.state)])
    return replace(x, var=var, state=state, binds=tuple(fresh_binds), update=tuple(update), result=result)
