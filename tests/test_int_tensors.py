"""Integer input tensors (dtype i32): the gather X[r, T[r]] and masks on data (Doc[b, i] == Doc[b, j]).

- the syntax: parsed, lowered to a DataCond (a gather is the sum over its dimension of the element
  whose index equals the data), every misuse one clear SpecError line (exit 2 from the CLI);
- the float64 interpreter on generated cases against numpy: random masks of causal and document
  comparisons over random document layouts (documents of length 1, one document, all distinct),
  gather targets at 0, C - 1, -1 and C (out of range: nothing gathered) and ignore_index rows;
- the export: the conditions are Z comparisons of t_Doc : nat -> nat -> Z, and coqc checks the
  obligations of a gather and of a document mask;
- the printed kernels (rowwise cross-entropy, document-masked attention on wgmma and mma.sync)
  run through the CPU emulation against numpy float64 on the same layouts;
- mutations caught: the printed document comparison as <=, the printed gather off by one.
"""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from codegen.mappings.ctx_common import DEFAULT_OPTIONS
from codegen.emu import run_printed
from codegen.kir.lower import lower
from codegen.mappings import print_kernel
from compiler.derive import derive
from compiler.errors import SpecError
from compiler.int_inputs import draw_int, gather_extents
from compiler.interp import run_program
from compiler.ir import DataCond, DataRead, Reduce, Select, walk
from compiler.lower_spec import lower_spec
from compiler.parse import PIntRead, PRead, parse_statement
from compiler.spec import load_spec_file, parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

pytestmark = pytest.mark.xdist_group("int_tensors")

ATTENTION = """
name: doc_attn
sizes: {B: dynamic, N: dynamic}
inputs:
  S: {shape: [B, N, N], dtype: f32}
  V: {shape: [B, N], dtype: f32}
  Doc: {shape: [B, N], dtype: i32}
statements:
  - "P[b, i, j] = softmax(j | MASK: S[b, i, j])"
  - "O[b, i] = sum(j: P[b, i, j] * V[b, j])"
output: {tensor: O, dtype: f32}
"""

GATHER = """
name: gather
sizes: {R: dynamic, C: dynamic}
inputs:
  X: {shape: [R, C], dtype: f32}
  T: {shape: [R], dtype: i32}
statements:
  - "M[r] = max(k: X[r, k])"
  - "L[r] = sum(k: exp(X[r, k] - M[r]))"
  - "loss[r] = where(T[r] >= 0, M[r] + log(L[r]) - X[r, T[r]], 0)"
output: {tensor: loss, dtype: f32}
"""


def _spec(text: str, **subst: str):
    for k, v in subst.items():
        text = text.replace(k, v)
    return parse_spec_text(text, "<test>")


def _bad(text: str) -> str:
    with pytest.raises(SpecError) as info:
        lower_spec(parse_spec_text(text, "<test>"))
    line = str(info.value)
    assert "\n" not in line
    return line


# --------------------------------------------------------------------------- syntax


def test_the_gather_and_the_data_comparison_parse():
    st = parse_statement("loss[r] = X[r, T[r]]")
    assert isinstance(st.body, PRead) and isinstance(st.body.idx[1], PIntRead) and st.body.idx[1].tensor == "T"
    st = parse_statement("P[b, i, j] = softmax(j | j <= i && Doc[b, i] == Doc[b, j]: S[b, i, j])")
    eq = st.body.guard[1]
    assert isinstance(eq.lhs, PIntRead) and isinstance(eq.rhs, PIntRead) and eq.op == "=="


def test_the_gather_lowers_to_a_point_guarded_sum():
    prog = lower_spec(_spec(GATHER))
    loss = prog.def_named("loss")
    sums = [e for e in walk(loss.body) if isinstance(e, Reduce)]
    assert len(sums) == 1 and isinstance(sums[0].body, Select)
    (cond,) = sums[0].body.conds
    assert isinstance(cond, DataCond) and cond.op == "==" and cond.rhs == DataRead("T", cond.rhs.idx, cond.rhs.dims)
    assert str(gather_extents(prog)["T"]) == "C"


@pytest.mark.parametrize("statement, reason", [
    ("loss[r] = X[r, Y[r]]", "only integer inputs (dtype: i32) can be"),  # a float index
    ("loss[r] = sum(k | Y[r] == k: X[r, k])", "only integer inputs (dtype: i32) can be"),  # a float compared
    ("loss[r] = X[r, 0] * T[r]", "the integer input T is read as a value"),
    ("loss[r] = sum(k | k < 3 || T[r] == k: X[r, k])", "inside a disjunction (||) is not supported"),
    ("loss[r] = X[r, T[r] + 1]", "stands alone"),
    ("loss[r] = X[r, T[r, r]]", "T has 1 dimensions, indexed with 2"),
])
def test_misuse_is_one_clear_line(statement, reason):
    text = f"""
name: bad
sizes: {{R: dynamic, C: 7}}
inputs:
  X: {{shape: [R, C], dtype: f32}}
  Y: {{shape: [R], dtype: f32}}
  T: {{shape: [R], dtype: i32}}
statements:
  - "{statement}"
output: {{tensor: loss, dtype: f32}}
"""
    assert reason in _bad(text)


def test_misuse_exits_2_from_the_cli(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GATHER.replace("X[r, T[r]]", "X[r, M[r]]"))
    run = subprocess.run([sys.executable, "-m", "compiler", "build", str(path), "-o", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "only integer inputs" in run.stderr


def test_an_integer_output_is_refused():
    assert "output.dtype" in str(pytest.raises(SpecError, parse_spec_text,
                                               GATHER.replace("dtype: f32}\n", "dtype: i32}\n", 1).replace(
                                                   "{tensor: loss, dtype: f32}", "{tensor: loss, dtype: i32}"),
                                               "<t>").value)


# --------------------------------------------------------------------------- the interpreter


def _doc_layouts(rng: np.random.Generator, B: int, N: int) -> dict[str, np.ndarray]:
    return {
        "length_1": np.tile(np.arange(N, dtype=np.float64), (B, 1)),  # every document one token
        "one_document": np.zeros((B, N)),
        "distinct_ids": rng.permutation(B * N).reshape(B, N).astype(np.float64),  # no two equal, unsorted
        "runs": draw_int((B, N), None, rng),
    }


def _attention_reference(S, V, Doc, mask):
    B, N, _ = S.shape
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    out = np.zeros((B, N))
    for b in range(B):
        keep = mask(i, j, Doc[b][:, None], Doc[b][None, :])
        s = np.where(keep, S[b], -np.inf)
        m = np.max(s, axis=1, keepdims=True)
        e = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
        den = e.sum(axis=1, keepdims=True)
        p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
        out[b] = p @ V[b]
    return out


MASKS = {  # the spec's mask and its numpy meaning (doc values di, dj)
    "Doc[b, i] == Doc[b, j]": lambda i, j, di, dj: di == dj,
    "j <= i && Doc[b, i] == Doc[b, j]": lambda i, j, di, dj: (j <= i) & (di == dj),
    "Doc[b, j] <= Doc[b, i] && i - j < 3": lambda i, j, di, dj: (dj <= di) & (i - j < 3),
    "Doc[b, i] < Doc[b, j]": lambda i, j, di, dj: di < dj,
    "Doc[b, j] >= 1 && j <= i": lambda i, j, di, dj: (dj >= 1) & (j <= i),
}


@pytest.mark.parametrize("mask", list(MASKS))
def test_masks_on_data_evaluate_as_numpy(mask):
    rng = np.random.default_rng(len(mask))
    prog = lower_spec(_spec(ATTENTION, MASK=mask))
    B, N = 2, 11
    for name, Doc in _doc_layouts(rng, B, N).items():
        S, V = rng.standard_normal((B, N, N)) * 3, rng.standard_normal((B, N))
        ref = _attention_reference(S, V, Doc, MASKS[mask])
        for contract in (True, False):
            got = run_program(prog, {"B": B, "N": N}, {"S": S, "V": V, "Doc": Doc}, contract=contract)["O"]
            assert np.abs(got - ref).max() <= 1e-12, (mask, name)


def _ce_reference(X, T):
    lse = np.log(np.exp(X - X.max(1, keepdims=True)).sum(1)) + X.max(1)
    C = X.shape[1]
    picked = np.array([X[r, int(t)] if 0 <= t < C else 0.0 for r, t in enumerate(T)])
    return np.where(T >= 0, lse - picked, 0.0)


@pytest.mark.parametrize("C", [1, 2, 7, 64])
def test_the_gather_evaluates_as_numpy_at_every_target(C):
    """Targets 0 and C - 1 (the ends), -100 (ignore_index: loss 0), C and C + 5 (out of range:
    nothing gathered, the loss is the row's log-sum-exp)."""
    prog = lower_spec(_spec(GATHER))
    rng = np.random.default_rng(C)
    T = np.array([0, C - 1, -100, C, C + 5, *rng.integers(0, C, 4)], dtype=np.float64)
    X = rng.standard_normal((len(T), C)) * 5
    for contract in (True, False):
        got = run_program(prog, {"R": len(T), "C": C}, {"X": X, "T": T}, contract=contract)["loss"]
        assert np.abs(got - _ce_reference(X, T)).max() <= 1e-12


def test_integer_inputs_are_drawn_for_their_use():
    rng = np.random.default_rng(0)
    T = draw_int((4000,), 7, rng)
    assert set(np.unique(T)) == set(range(-1, 8))  # both ends in range and both neighbours out of it
    Doc = draw_int((3, 500), None, rng)
    steps = np.diff(Doc, axis=-1)
    assert set(np.unique(steps)) == {0, 1} and np.all(Doc[:, 0] == 0)  # nondecreasing runs from 0
    lengths = np.diff(np.flatnonzero(np.diff(np.concatenate([[-1], Doc[0], [-2]]))))
    assert lengths.min() == 1  # documents of length 1 occur


# --------------------------------------------------------------------------- the export


def test_the_export_compares_integers(tmp_path):
    from compiler.obligations import obligation_for
    from compiler.obligations_base import coq_text

    spec = _spec(GATHER + "check_sizes: {R: 3, C: 5}\nschedule:\n  - {rule: fuse_let, producer: L, def: loss}\n")
    d = derive(spec, "<t>", seed=1)
    text = coq_text(obligation_for(d.steps[0], d.programs[0], d.programs[1]))
    assert "Z.eqb" in text and "Z.leb" in text and "(t_T : nat -> Z)" in text


@pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")
@pytest.mark.parametrize("which", ["gather", "document"])
def test_coqc_checks_the_obligations(which, tmp_path):
    """The gather's fuse_let / parallel steps and the document mask's split_softmax, fuse, assoc
    and tiles (data guards compared through reads at indices spelt differently), and each
    final program's safety obligation (exp sites under data guards)."""
    if which == "gather":
        text = GATHER + "check_sizes: {R: 3, C: 5}\nschedule:\n" + "".join(
            f"  - {step}\n" for step in ("{rule: fuse_let, producer: L, def: loss}",
                                         "{rule: fuse_let, producer: M, def: loss}",
                                         "{rule: parallel, def: loss, index: r, to: grid.x}"))
    else:
        text = _spec_text(ATTENTION, MASK="j <= i && Doc[b, i] == Doc[b, j]") + "schedule:\n" + "".join(
            f"  - {step}\n" for step in ("{rule: split_softmax, def: P}", "{rule: fuse, producer: P}",
                                         "{rule: assoc, def: O, index: j}",
                                         "{rule: tile, def: O, index: j, size: 4}",
                                         "{rule: tile, def: L, index: j_, size: 4, outer: jo_l, inner: ji_l}"))
    path = tmp_path / f"{which}.yaml"
    path.write_text(text)
    run = subprocess.run([sys.executable, "-m", "compiler", "--plain", "build", str(path), "-o", str(tmp_path / "o"),
                          "--no-codegen", "--seed", "1"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    proofs = (tmp_path / "o" / "proofs")
    assert any("Z.eqb" in p.read_text() for p in proofs.glob("*.v"))
    assert "obligations checked by coqc" in run.stdout


def _spec_text(text: str, **subst: str) -> str:
    for k, v in subst.items():
        text = text.replace(k, v)
    return text


# --------------------------------------------------------------------------- the printed kernels


def _printed(path: Path, sizes: dict | None = None):
    doc = yaml.safe_load(path.read_text())
    if sizes:
        doc["sizes"].update(sizes)
    spec = parse_spec_text(yaml.safe_dump(doc, sort_keys=False), str(path))
    d = derive(spec, str(path), seed=2)
    return print_kernel(lower(d.programs[-1], doc["name"]), DEFAULT_OPTIONS)


@pytest.fixture(scope="module")
def ce_kernel():
    return _printed(EXAMPLES / "cross_entropy.yaml", {"C": "dynamic"})


@pytest.fixture(scope="module")
def attention_kernels():
    return {instr: _printed(EXAMPLES / "pending" / name) for instr, name in
            (("wgmma", "attention_document_mask.yaml"), ("mma_sync", "attention_document_mask_mma.yaml"))}


def _ce_run(printed, X, T):
    return np.asarray(run_printed(printed, 0, [X, T], {"R": X.shape[0], "C": X.shape[1]}), dtype=np.float64)


@pytest.mark.parametrize("C", [1, 7, 1000])
def test_the_cross_entropy_kernel_gathers_every_target(ce_kernel, C):
    """One read of the target and of its logit per row (no third sweep over the row)."""
    assert ce_kernel.mapping == "rowwise" and "gather over g_x" in ce_kernel.plan.reductions
    assert "== (long long)p_T[" not in ce_kernel.variants[0].source.source  # no compare per column
    rng = np.random.default_rng(C)
    T = np.array([0, C - 1, -100, C, *rng.integers(0, C, 3)], dtype=np.float64)
    X = (rng.standard_normal((len(T), C)) * 4).astype(np.float16).astype(np.float64)
    assert np.abs(_ce_run(ce_kernel, X, T) - _ce_reference(X, T)).max() <= 1e-4 * max(1.0, np.abs(X).max())


def _mutated(printed, old: str, new: str):
    """Every variant's text with `old` replaced (it must occur in each)."""
    variants = []
    for v in printed.variants:
        assert old in v.source.source, old
        variants.append(replace(v, source=replace(v.source, source=v.source.source.replace(old, new))))
    return replace(printed, variants=tuple(variants))


def test_a_gather_off_by_one_in_the_printer_is_caught(ce_kernel):
    bad = _mutated(ce_kernel, "? (long long)p_T[", "? 1 + (long long)p_T[")
    rng = np.random.default_rng(5)
    X = rng.standard_normal((4, 9))
    T = np.array([0, 3, 8, 5], dtype=np.float64)
    assert np.abs(_ce_run(bad, X, T) - _ce_reference(X, T)).max() > 1e-2


def _attn_run(printed, Q, K, V, Doc):
    B, H, N, _ = Q.shape
    return np.asarray(run_printed(printed, len(printed.variants) - 1, [Q, K, V, Doc], {"B": B, "H": H, "N": N}),
                      dtype=np.float64)


def _attn_reference(Q, K, V, Doc):
    B, H, N, D = Q.shape
    out = np.zeros_like(Q)
    for h in range(H):
        S = np.einsum("bie,bje->bij", Q[:, h], K[:, h]) / math.sqrt(D)
        for d in range(D):
            out[:, h, :, d] = _attention_reference(S, V[:, h, :, d], Doc, MASKS["j <= i && Doc[b, i] == Doc[b, j]"])
    return out


def _qkv(rng, B, H, N, D):
    return tuple(rng.standard_normal((B, H, N, D)).astype(np.float16).astype(np.float64) for _ in range(3))


@pytest.mark.parametrize("instr", ["wgmma", "mma_sync"])
@pytest.mark.parametrize("layout", ["length_1", "one_document", "distinct_ids", "runs"])
def test_the_document_masked_kernels_match_float64(attention_kernels, instr, layout):
    printed = attention_kernels[instr]
    assert printed.mapping == f"online_fold_{instr}"
    rng = np.random.default_rng(len(layout))
    B, H, N = 1, 1, 150  # a partial key and query tile
    D = 128 if instr == "wgmma" else 64
    Q, K, V = _qkv(rng, B, H, N, D)
    Doc = _doc_layouts(rng, B, N)[layout]
    got = _attn_run(printed, Q, K, V, Doc)
    assert np.abs(got - _attn_reference(Q, K, V, Doc)).max() <= 2e-2


@pytest.mark.parametrize("instr", ["wgmma", "mma_sync"])
def test_a_document_comparison_printed_as_le_is_caught(attention_kernels, instr):
    printed = attention_kernels[instr]
    bad = _mutated(printed, "] == (long long)p_x0[", "] <= (long long)p_x0[")
    rng = np.random.default_rng(3)
    B, H, N = 1, 1, 150
    D = 128 if instr == "wgmma" else 64
    Q, K, V = _qkv(rng, B, H, N, D)
    Doc = rng.integers(0, 4, (B, N)).astype(np.float64)  # unsorted ids: <= differs from == under j <= i
    got = _attn_run(bad, Q, K, V, Doc)
    assert np.abs(got - _attn_reference(Q, K, V, Doc)).max() > 5e-2
