"""Terms of the proof semantics, and the IR → term exporter used by compiler/obligations.py.

A small term language (tuples) rendered to Coq (checked here) and Lean 4 (not checked here):

    ('var', name) ('num', n) ('app', head, [args]) ('lam', [names], body) ('let', name, val, body)
    ('nop', '+'|'*'|'-', a, b)                         nat arithmetic
    ('lt'|'le'|'eq', a, b) ('conj', [p]) ('disj', [p]) ('iff', p, q) ('true',)   propositions

`Exporter` turns IR expressions into terms.  Everything free in them is recorded so the
obligation can quantify over it: index variables and dynamic sizes (nat, `i_<v>` / `n_<v>`),
input and definition tensors (`t_<T> : nat -> … -> R`), buffers and fold state bound outside
the exported site (`b_<X>` functions, `v_<x> : R`), constants other than 0/1/-inf (`c_<label>`
or `c0, c1, …` : R).  Fixed sizes are replaced by their values.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from .ir import (
    UNARY_FUNCTIONS, Aff, Bin, Cond, DataCond, DataRead, DataSpan, Or, Const, Def, Expr, Ext, Fold, IndexValue, Let, Program, Read, Reduce,
    Select, Softmax, Un,
)
from .obligations_types import EXT, FIN, join, program_types
from .printer import show_expr

Term = tuple

# --------------------------------------------------------------------------- constructors


def V(name: str) -> Term:
    return ("var", name)


def N(n: int) -> Term:
    return ("num", int(n))


def A(head: str, *args: Term) -> Term:
    return ("app", head, list(args))


def Lam(names: list[str], body: Term) -> Term:
    return ("lam", list(names), body) if names else body


def conj(ps: list[Term]) -> Term:
    ps = [p for p in ps if p != ("true",)]
    if not ps:
        return ("true",)
    return ps[0] if len(ps) == 1 else ("conj", ps)


# --------------------------------------------------------------------------- rendering

_COQ_HEADS = {"ltb": "Nat.ltb", "leb": "Nat.leb", "min": "Nat.min", "natmod": "Nat.modulo",
              "zltb": "Z.ltb", "zleb": "Z.leb", "zeqb": "Z.eqb", "zofnat": "Z.of_nat", "zsub": "Z.sub"}
_LEAN_HEADS = {
    "zero": "KAlg.zero", "one": "KAlg.one", "ninf": "Ext.ninf", "Fin": "Ext.fin", "add": "KAlg.add",
    "mul": "KAlg.mul", "max": "emax", "exp": "KAlg.exp", "neg": "KAlg.neg", "inv": "KAlg.inv",
    "log": "KAlg.log", "gt": "KAlg.gt",
    "ltb": "Nat.blt", "leb": "Nat.ble", "andb": "and", "orb": "or", "min": "Nat.min", "natmod": "Nat.mod", "pair": "Prod.mk",
    "fst": "Prod.fst", "snd": "Prod.snd", "mkOState": "OState.mk", "st_m": "OState.st_m",
    "st_l": "OState.st_l", "st_acc": "OState.st_acc",
    "zltb": "zltb", "zleb": "zleb", "zeqb": "zeqb", "zofnat": "Int.ofNat", "zsub": "Int.sub",
}
INT = "Z"  # the value type of an integer input tensor (t_T : nat -> … -> Z; Int in Lean)


def _atomic(t: Term) -> bool:
    return t[0] in ("var", "num", "true") or (t[0] == "app" and not t[2])


def render(t: Term, lang: str = "coq") -> str:
    k = t[0]
    if k == "var":
        return t[1]
    if k == "num":
        return _coq_nat(t[1]) if lang == "coq" else str(t[1])
    if k == "true":
        return "True"
    if k == "app":
        heads = _COQ_HEADS if lang == "coq" else _LEAN_HEADS
        h = heads.get(t[1], t[1])
        if not t[2]:
            return h
        return h + " " + " ".join(_arg(a, lang) for a in t[2])
    if k == "lam":
        return f"fun {' '.join(t[1])} => {render(t[2], lang)}"
    if k == "let":
        sep = " in " if lang == "coq" else "; "
        return f"let {t[1]} := {render(t[2], lang)}{sep}{render(t[3], lang)}"
    if k == "nop":
        return f"{_nat_arg(t[2], lang)} {t[1]} {_nat_arg(t[3], lang)}"
    if k in ("lt", "le", "eq"):
        op = {"lt": "<", "le": "<=" if lang == "coq" else "≤", "eq": "="}[k]
        if k == "eq" and not (t[1][0] == "nop" or t[2][0] == "nop"):
            return f"{_arg(t[1], lang)} {op} {_arg(t[2], lang)}"
        return f"{render(t[1], lang)} {op} {render(t[2], lang)}"
    if k == "forall":
        binders = " ".join(f"({n} : {coq_type(ty, lang)})" for n, ty in t[1])
        kw = "forall" if lang == "coq" else "∀"
        return f"{kw} {binders}, {render(t[2], lang)}" if t[1] else render(t[2], lang)
    if k == "imp":
        arrow = " -> " if lang == "coq" else " → "
        return arrow.join([f"({render(h, lang)})" for h in t[1]] + [f"({render(t[2], lang)})"])
    if k == "exists":
        kw = "exists" if lang == "coq" else "∃"
        return f"{kw} {' '.join(t[1])}, {render(t[2], lang)}"
    if k == "conj":
        op = " /\\ " if lang == "coq" else " ∧ "
        return op.join(f"({render(p, lang)})" for p in t[1])
    if k == "disj":
        op = " \\/ " if lang == "coq" else " ∨ "
        return "(" + op.join(f"({render(p, lang)})" for p in t[1]) + ")"
    if k == "iff":
        op = " <-> " if lang == "coq" else " ↔ "
        return f"({render(t[1], lang)}){op}({render(t[2], lang)})"
    raise ValueError(f"bad term {t!r}")


def _coq_nat(n: int) -> str:
    """A nat literal for Coq: from 5000 on Coq reads a numeral as an opaque `Nat.of_num_uint`
    application that lia cannot see through (an 8192-column row made every bound unprovable and
    the proof search endless), so large values are written in base 4096 with small literals."""
    if n < 5000:
        return str(n)
    q, r = divmod(n, 4096)
    return f"({_coq_nat(q)} * 4096{f' + {r}' if r else ''})"


def _arg(a: Term, lang: str) -> str:
    s = render(a, lang)
    return s if _atomic(a) else f"({s})"


def _nat_arg(a: Term, lang: str) -> str:
    s = render(a, lang)
    return s if _atomic(a) or (a[0] == "nop" and a[1] == "*" and a[2][0] == "num") else f"({s})"


def coq_type(arity: int | str | tuple[int, str], lang: str = "coq") -> str:
    """nat, a real function R -> R ('fun'), or a tensor type nat -> … -> R (arity k), or (k, 'X'): … -> ext R."""
    if arity == "nat":
        return "nat" if lang == "coq" else "Nat"
    arrow = " -> " if lang == "coq" else " → "
    if arity == "fun":
        return f"R{arrow}R"
    nat = "nat" if lang == "coq" else "Nat"
    k, ty = arity if isinstance(arity, tuple) else (arity, FIN)
    val = "R" if ty == FIN else ("Z" if lang == "coq" else "Int") if ty == INT else \
        ("ext R" if lang == "coq" else "Ext R")
    return arrow.join([nat] * int(k) + [val])


# --------------------------------------------------------------------------- names


def san(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s


class ExportError(Exception):
    """An IR form the exporter does not cover."""


@dataclass
class Exporter:
    """Exports IR expressions of one program pair (before/after) to terms, collecting the
    free names.  `inline` defs are read through their definition (`genAt` nests)."""

    prog: Program
    inline: dict[str, Def] = field(default_factory=dict)
    nat_vars: dict[str, None] = field(default_factory=dict)
    tensors: dict[str, int] = field(default_factory=dict)
    bufs: dict[str, int] = field(default_factory=dict)
    consts: dict[str, str] = field(default_factory=dict)
    # the language's functions other than the algebra's exp, neg, log (sqrt, tanh, …: `f_<op> : R -> R`)
    # and the value of an index (`f_ofnat : nat -> R`) are quantified: an obligation holds for every
    # such function, so for the real ones; name -> binder type ('fun' or 1)
    funs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _const_keys: dict[Any, str] = field(default_factory=dict)
    _fresh: int = 0
    extra_tensors: set[str] = field(default_factory=set)
    other: Program | None = None  # the program before the step (for the types of its names)
    result_ty: dict[str, str] = field(default_factory=dict)  # t_/b_/v_ name -> R | X
    vty: dict[str, str] = field(default_factory=dict)  # bound buffer / state name -> R | X

    def __post_init__(self) -> None:
        self.fixed = {n: v for n, v in self.prog.sizes if v is not None}
        self.size_names = {n for n, _ in self.prog.sizes}
        self.tensor_names = {n for n, _ in self.prog.inputs} | {d.name for d in self.prog.defs}
        self.types = program_types(self.prog, *([self.other] if self.other is not None else []))

    def arity_type(self, name: str, arity: int) -> int | tuple[int, str]:
        """The binder type of a quantified t_/b_/v_ name."""
        ty = self.result_ty.get(name)
        return (arity, ty) if ty in (EXT, INT) else arity

    def fresh(self, base: str) -> str:
        self._fresh += 1
        return f"{base}{self._fresh}"

    # ---------------------------------------------------------------- indices

    def idx_var(self, name: str, env: dict) -> Term:
        ent = env.get(name)
        if ent is not None and ent[0] == "idx":
            return ent[1]
        if name in self.fixed:
            return N(self.fixed[name])
        coq = ("n_" if name in self.size_names else "i_") + san(name)
        self.nat_vars.setdefault(coq, None)
        return V(coq)

    def aff_parts(self, a: Aff, env: dict) -> tuple[list[Term], list[Term], int]:
        """(positive pieces, negative pieces, constant)."""
        pos: list[Term] = []
        neg: list[Term] = []
        const = a.const
        for name, c in a.terms:
            t = self.idx_var(name, env)
            if t[0] == "num":
                const += c * t[1]
                continue
            piece = t if abs(c) == 1 else ("nop", "*", N(abs(c)), t)
            (pos if c > 0 else neg).append(piece)
        return pos, neg, const

    @staticmethod
    def _sum(pieces: list[Term], const: int) -> Term:
        out: Term | None = None
        for p in pieces:
            out = p if out is None else ("nop", "+", out, p)
        if const or out is None:
            out = N(const) if out is None else ("nop", "+", out, N(const))
        return out

    def aff(self, a: Aff, env: dict) -> Term:
        pos, neg, const = self.aff_parts(a, env)
        if not neg and const >= 0:
            return self._sum(pos, const)
        self.notes.append(f"index {a} has negative parts: exported with truncating nat subtraction")
        return ("nop", "-", self._sum(pos, max(const, 0)), self._sum(neg, max(-const, 0)))

    def index_value(self, a: Aff, env: dict) -> Term:
        """The number an affine index expression denotes: ofnat(positive part) - ofnat(negative part),
        exact over the integers whatever ofnat is, with no truncating nat subtraction."""
        pos, neg, const = self.aff_parts(a, env)
        self.funs["f_ofnat"] = 1
        plus = A("f_ofnat", self._sum(pos, max(const, 0)))
        if not neg and const >= 0:
            return plus
        return A("sub", plus, A("f_ofnat", self._sum(neg, max(-const, 0))))

    def cond_sides(self, c: Cond, env: dict) -> tuple[Term, Term]:
        pl, nl, kl = self.aff_parts(c.lhs, env)
        pr, nr, kr = self.aff_parts(c.rhs, env)
        if not nl and not nr and kl >= 0 and kr >= 0:
            return self._sum(pl, kl), self._sum(pr, kr)
        # move negative pieces across: lhs - rhs (<, <=) 0  over the integers
        k = kl - kr
        return self._sum(pl + nr, max(k, 0)), self._sum(pr + nl, max(-k, 0))

    def data_side(self, s: Aff | DataRead, env: dict) -> Term:
        """A side of a data comparison as an integer (Z): a read of the integer input, or the
        affine expression as Z.of_nat (positive part) - Z.of_nat (negative part)."""
        if isinstance(s, DataRead):
            name = "t_" + san(s.tensor)
            self.tensors[name] = len(s.idx)
            self.result_ty[name] = INT
            return A(name, *(self.aff(a, env) for a in s.idx)) if s.idx else V(name)
        pos, neg, const = self.aff_parts(s, env)
        plus = A("zofnat", self._sum(pos, max(const, 0)))
        if not neg and const >= 0:
            return plus
        return A("zsub", plus, A("zofnat", self._sum(neg, max(-const, 0))))

    def cond_bool(self, c: Cond | Or | DataCond, env: dict) -> Term:
        if isinstance(c, DataSpan):  # MASK-DATA's conjunct (compiler/obligations_datamask.py)
            from .obligations_datamask import span_bool
            return span_bool(self, c, env)
        if isinstance(c, DataCond):  # compared as integers (Z.ltb / Z.leb / Z.eqb)
            head = {"<": "zltb", "<=": "zleb", "==": "zeqb"}[c.op]
            return A(head, self.data_side(c.lhs, env), self.data_side(c.rhs, env))
        if isinstance(c, Or):  # a disjunction: orb of its comparisons
            bs = [self.cond_bool(p, env) for p in c.parts]
            out = bs[-1]
            for b in reversed(bs[:-1]):
                out = A("orb", b, out)
            return out
        l, r = self.cond_sides(c, env)
        return A("ltb" if c.op == "<" else "leb", l, r)

    def conds_bool(self, conds: tuple[Cond, ...], env: dict) -> Term:
        bs = [self.cond_bool(c, env) for c in conds]
        out = bs[-1]
        for b in reversed(bs[:-1]):
            out = A("andb", b, out)
        return out

    def cond_prop(self, c: Cond | Or | DataCond, env: dict) -> Term:
        if isinstance(c, DataSpan):
            from .obligations_datamask import span_prop
            return span_prop(self, c, env)
        if isinstance(c, DataCond):
            return ("eq", self.cond_bool(c, env), V("true"))
        if isinstance(c, Or):
            return ("disj", [self.cond_prop(p, env) for p in c.parts])
        l, r = self.cond_sides(c, env)
        return ("lt" if c.op == "<" else "le", l, r)

    def ext(self, e: Ext, env: dict) -> Term:
        if all(not (a.names() - set(self.fixed)) for a, _ in e.parts) and not any(
            env.get(n) for a, _ in e.parts for n in a.names()
        ):
            return N(e.evaluate(self.fixed))
        parts = []
        for a, d in e.parts:
            t = self.aff(a, env)
            parts.append(t if d == 1 else A("ceilDiv", t, N(d)))
        out = parts[-1]
        for p in reversed(parts[:-1]):
            out = A("min", p, out)
        return out

    # ---------------------------------------------------------------- expressions

    def const(self, c: Const) -> Term:
        v = c.value
        if v == 0:
            return A("zero")
        if v == 1:
            return A("one")
        if math.isinf(v) and v < 0:
            return A("ninf")
        key = c.label or repr(v)
        if key not in self._const_keys:
            name = f"c_{san(c.label)}" if c.label else f"c{len(self._const_keys)}"
            self._const_keys[key] = name
            self.consts[name] = c.label or repr(v)
        return V(self._const_keys[key])

    def read(self, r: Read, env: dict) -> Term:
        idx = [self.aff(a, env) for a in r.idx]
        ent = env.get(r.tensor)
        if ent is not None:
            if ent[0] == "buf":
                return A(ent[1], *idx) if idx else V(ent[1])
            if ent[0] == "term":  # a state component bound to a term
                return ent[1]
        if r.tensor in self.inline:
            return self.gen_read(self.inline[r.tensor], idx)
        if r.tensor in self.tensor_names or r.tensor in self.extra_tensors:
            name = "t_" + san(r.tensor)
            self.tensors[name] = len(idx)
            self.result_ty[name] = self.types.get(r.tensor, FIN)
            return A(name, *idx) if idx else V(name)
        # a buffer or state bound outside the exported site: arbitrary
        name = ("b_" if idx else "v_") + san(r.tensor)
        self.bufs[name] = len(idx)
        self.result_ty[name] = self.types.get(r.tensor, FIN)
        return A(name, *idx) if idx else V(name)

    def read_type(self, r: Read, env: dict) -> str:
        ent = env.get(r.tensor)
        if ent is not None and ent[0] == "buf":
            return self.vty.get(ent[1], self.types.get(r.tensor, FIN))
        if ent is not None and ent[0] == "term":
            return ent[2] if len(ent) > 2 else FIN
        return self.types.get(r.tensor, FIN)

    def gen_read(self, d: Def, idx: list[Term]) -> Term:
        """A read of a generated tensor: genAt E0 (fun p0 => genAt E1 (fun p1 => body) i1) i0."""
        if d.guard or d.store != tuple(Aff.of(lp.var) for lp in d.loops):
            raise ExportError(f"{d.name} has a tiled/guarded loop nest; its reads cannot be inlined")
        names = [self.fresh("p_" + san(lp.var) + "_") for lp in d.loops]
        env = {lp.var: ("idx", V(n)) for lp, n in zip(d.loops, names)}
        ty = self.types.get(d.name, FIN)
        out = self.lift(*self.texpr(d.body, env), ty)
        gen = "genAtX" if ty == EXT else "genAt"
        for k in reversed(range(len(d.loops))):
            outer_env = {lp.var: ("idx", V(n)) for lp, n in zip(d.loops[:k], names[:k])}
            out = A(gen, self.ext(d.loops[k].ext, outer_env), Lam([names[k]], out), idx[k])
        return out

    def bind_var(self, var: str, env: dict, prefix: str = "i_") -> tuple[str, dict]:
        name = prefix + san(var)
        env2 = dict(env)
        env2[var] = ("idx", V(name))
        return name, env2

    @staticmethod
    def lift(t: Term, ty: str, want: str) -> Term:
        """t of type ty as a value of type want (R -> ext R by Fin; never ext R -> R)."""
        if ty == want:
            return t
        if want == EXT:
            return A("Fin", t)
        raise ExportError("ring arithmetic on a value that may be -inf (a max, -inf or a masked score)")

    def expr(self, e: Expr, env: dict) -> Term:
        return self.texpr(e, env)[0]

    def _fin(self, e: Expr, env: dict) -> Term:
        return self.lift(*self.texpr(e, env), FIN)

    def texpr(self, e: Expr, env: dict) -> tuple[Term, str]:
        """(term, type): type R (finite) or X (extended, -inf possible)."""
        if isinstance(e, Const):
            return self.const(e), (EXT if math.isinf(e.value) and e.value < 0 else FIN)
        if isinstance(e, Read):
            return self.read(e, env), self.read_type(e, env)
        if isinstance(e, Bin):
            (a, ta), (b, tb) = self.texpr(e.a, env), self.texpr(e.b, env)
            if e.op == "+" and EXT in (ta, tb) and FIN in (ta, tb):  # M + log L with M maybe -inf
                return (A("eadd", a, b) if ta == EXT else A("eadd", b, a)), EXT
            if e.op == "-" and ta == EXT and tb == FIN:  # (M + log L) - x: -inf - x is -inf
                return A("eadd", a, A("neg", b)), EXT
            if e.op == "max":
                return A("max", self.lift(a, ta, EXT), self.lift(b, tb, EXT)), EXT
            if e.op == "rescale":
                if ta == tb == FIN:
                    return A("exp", A("sub", a, b)), FIN
                return A("rescale", self.lift(a, ta, EXT), self.lift(b, tb, EXT)), FIN
            if e.op == "gt":  # the algebra's step gt : R -> R -> R, on finite operands only
                if EXT in (ta, tb):
                    raise ExportError("gt of a value that may be -inf (a max, -inf or a masked score): "
                                      + " ".join(show_expr(e).split()))
                return A("gt", a, b), FIN
            op = {"+": "add", "-": "sub", "*": "mul", "/": "div"}.get(e.op)
            if op is None:
                raise ExportError(f"binary operator {e.op}")
            return A(op, self.lift(a, ta, FIN), self.lift(b, tb, FIN)), FIN
        if isinstance(e, Un):
            if e.op == "exp" and isinstance(e.a, Bin) and e.a.op == "-":
                (a, ta), (b, tb) = self.texpr(e.a.a, env), self.texpr(e.a.b, env)
                if EXT in (ta, tb):  # exp (a - b) with -inf possible: expd, no ring subtraction
                    return A("expd", self.lift(a, ta, EXT), self.lift(b, tb, EXT)), FIN
                return A("exp", A("sub", a, b)), FIN
            if e.op == "exp":
                x, tx = self.texpr(e.a, env)
                return (A("eexp", x) if tx == EXT else A("exp", x)), FIN
            if e.op in ("neg", "log"):  # fields of the algebra
                return A(e.op, self._fin(e.a, env)), FIN
            if e.op in UNARY_FUNCTIONS:
                name = "f_" + san(e.op)
                self.funs[name] = "fun"
                return A(name, self._fin(e.a, env)), FIN
            raise ExportError(f"unary operator {e.op}")
        if isinstance(e, IndexValue):
            return self.index_value(e.aff, env), FIN
        if isinstance(e, Reduce):
            return self.reduce(e, env)
        if isinstance(e, Select):
            (x, tx), (y, ty) = self.texpr(e.then, env), self.texpr(e.other, env)
            t = join(tx, ty)
            return A("sel", self.conds_bool(e.conds, env), self.lift(x, tx, t), self.lift(y, ty, t)), t
        if isinstance(e, Softmax):
            n = self.ext(e.ext, env)
            k, env2 = self.bind_var(e.var, env)
            score = Lam([k], self._fin(e.score, env2))
            at = self.aff(e.at, env)
            if e.mask:
                return A("softmaxAtG", Lam([k], self.conds_bool(e.mask, env2)), n, score, at), FIN
            return A("softmaxAt", n, score, at), FIN
        if isinstance(e, Let):
            name, val, env2 = self.binding(e.bind, env)
            body, tb = self.texpr(e.body, env2)
            return ("let", name, val, body), tb
        if isinstance(e, Fold):
            return self.fold(e, env)
        raise ExportError(f"expression {type(e).__name__}")

    def reduce(self, e: Reduce, env: dict) -> tuple[Term, str]:
        if e.op not in ("sum", "max"):
            raise ExportError(f"reduction {e.op}")
        want = FIN if e.op == "sum" else EXT
        head = "sumTo" if e.op == "sum" else "maxTo"
        n = self.ext(e.ext, env)
        if e.mma is not None and e.op == "sum":
            if e.mma.k == 16 and n[0] == "num" and n[1] % 16 == 0:
                o, kk = self.fresh("o_" + san(e.var) + "_"), self.fresh("k_" + san(e.var) + "_")
                env2 = dict(env)
                env2[e.var] = ("idx", ("nop", "+", ("nop", "*", V(o), N(16)), V(kk)))
                body = self._fin(e.body, env2)
                return A("sumTo", N(n[1] // 16), Lam([o], A("mma16", Lam([kk], body)))), FIN
            self.notes.append(f"sum over {e.var} mapped to {e.mma.instr} k={e.mma.k}: exported as a plain sum")
        v, env2 = self.bind_var(e.var, env)
        body = self.lift(*self.texpr(e.body, env2), want)
        return A(head, n, Lam([v], body)), want

    def binding(self, b, env: dict) -> tuple[str, Term, dict]:
        if b.dims:
            names, env_v = [], dict(env)
            for v, x in b.dims:
                nm = "i_" + san(v)
                names.append(nm)
                env_v[v] = ("idx", V(nm))
            val, ty = self.texpr(b.value, env_v)
            val = Lam(names, val)
            coq = "b_" + san(b.name)
        else:
            val, ty = self.texpr(b.value, env)
            coq = "v_" + san(b.name)
        self.vty[coq] = ty
        env2 = dict(env)
        env2[b.name] = ("buf", coq)
        return coq, val, env2

    # ---------------------------------------------------------------- folds

    @staticmethod
    def state_mk(vals: list[Term]) -> Term:
        if len(vals) == 3:
            return A("mkOState", *vals)
        if len(vals) == 1:
            return vals[0]
        return A("pair", vals[0], Exporter.state_mk(vals[1:]))

    @staticmethod
    def state_proj(k: int, n: int, x: Term) -> Term:
        if n == 3:
            return A(("st_m", "st_l", "st_acc")[k], x)
        if n == 1:
            return x
        if k == 0:
            return A("fst", x)
        return Exporter.state_proj(k - 1, n - 1, A("snd", x))

    def fold_step(self, f: Fold, env: dict) -> Term:
        """fun v s => let <state> := proj s in let <binds> in mk <updates>"""
        n = len(f.state)
        v, env2 = self.bind_var(f.var, env)
        s = "s_" + san(f.var)
        lets: list[tuple[str, Term]] = []
        tys = self.state_types(f)
        for k, name in enumerate(f.state):
            coq = "v_" + san(name)
            lets.append((coq, self.state_proj(k, n, V(s))))
            env2[name] = ("buf", coq)
            self.vty[coq] = tys[k]
        for b in f.binds:
            coq, val, env2 = self.binding(b, env2)
            lets.append((coq, val))
        body = self.state_mk([self.lift(*self.texpr(u, env2), ty) for u, ty in zip(f.update, tys)])
        for coq, val in reversed(lets):
            body = ("let", coq, val, body)
        return Lam([v, s], body)

    def state_types(self, f: Fold) -> list[str]:
        tys = [self.types.get(name, FIN) for name in f.state]
        if len(tys) == 3 and tys != [EXT, FIN, FIN]:
            raise ExportError("a fold with three state values that is not (max, sum, sum)")
        return tys

    def fold(self, f: Fold, env: dict) -> tuple[Term, str]:
        n = len(f.state)
        tys = self.state_types(f)
        step = self.fold_step(f, env)
        init = self.state_mk([self.lift(*self.texpr(x, env), ty) for x, ty in zip(f.init, tys)])
        fs = "fs_" + san(f.var)
        env2 = dict(env)
        lets = []
        for k, name in enumerate(f.state):
            coq = "v_" + san(name)
            lets.append((coq, self.state_proj(k, n, V(fs))))
            env2[name] = ("buf", coq)
            self.vty[coq] = tys[k]
        body, ty = self.texpr(f.result, env2)
        for coq, val in reversed(lets):
            body = ("let", coq, val, body)
        return ("let", fs, A("foldN", step, init, self.ext(f.ext, env)), body), ty
