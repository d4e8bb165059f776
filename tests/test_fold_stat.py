"""FOLD-STAT: the attention fold also writes its rows' log-sum-exp LSE = m + log(l) (a second output).

The spec's values (float64, against a log-sum-exp computed here, fully masked rows -inf), the rule's
preconditions, a wrong statistic failing the step's numeric check, the build's kernel step
comparing both outputs (mma.sync and wgmma, rows with no live key included), the mappings that do
not print a second output refusing by name, and the backward reading the forward's LSE.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from compiler.derive import derive
from compiler.errors import DerivationError, SpecError
from compiler.interp import run_program
from compiler.spec import load_spec_file, parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
D64 = ROOT / "examples" / "flash_attention_d64_lse.yaml"
LSE_STATEMENTS = '''  - "Smax[b, h, i] = max(j | MASK: S[b, h, i, j])"
  - "LSE[b, h, i] = Smax[b, h, i] + log(sum(j | MASK: exp(S[b, h, i, j] - Smax[b, h, i])))"
output: {tensor: O, dtype: f16, also: [{tensor: LSE, dtype: f32}]}'''


def with_lse(example: str, mask: str, schedule_tail: bool = True, name: str = "lse_variant") -> str:
    """An attention example with LSE as a second output (and fold_stat as its last step)."""
    text = (ROOT / "examples" / example).read_text()
    text = re.sub(r"^name: .*$", f"name: {name}", text, count=1, flags=re.M)
    text = text.replace("output: {tensor: O, dtype: f16}", LSE_STATEMENTS.replace("MASK", mask))
    text = text.replace("  - {rule: fuse, producer: S}\n", "  - {rule: fuse, producer: S, def: O}\n", 1)
    if schedule_tail:
        text = text.rstrip("\n") + "\n  - {rule: fold_stat, def: O, stat: LSE}\n"
    return text


def logsumexp_rows(q: np.ndarray, k: np.ndarray, scale: float, keep) -> np.ndarray:
    s = scale * np.einsum("bhie,bhje->bhij", q, k)
    n = s.shape[-1]
    live = keep(np.arange(n)[:, None], np.arange(n)[None, :])
    s = np.where(live, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return (safe + np.log(np.exp(s - safe).sum(axis=-1, keepdims=True)))[..., 0]


@pytest.mark.parametrize("example,mask,keep", [
    ("flash_attention_d64.yaml", "j <= i", lambda i, j: j <= i),
    ("attention_strict_causal.yaml", "j < i", lambda i, j: j < i),   # row 0 has no live key: -inf
])
def test_final_program_writes_the_rows_logsumexp(example, mask, keep):
    spec = parse_spec_text(with_lse(example, mask))
    d = derive(spec, seed=3)
    assert d.steps[-1].rule == "fold_stat" and d.steps[-1].numeric["passed"]
    final = d.final
    assert [x.name for x in final.defs] == ["O"] and [a.name for a in final.defs[0].also] == ["LSE"]
    sizes = {"B": 1, "H": 2, "N": 150, "D": spec.sizes["D"]}
    rng = np.random.default_rng(0)
    ins = {n: rng.standard_normal((1, 2, 150, spec.sizes["D"])) for n in ("Q", "K", "V")}
    got = run_program(final, sizes, ins)["LSE"]
    want = logsumexp_rows(ins["Q"], ins["K"], 1 / np.sqrt(spec.sizes["D"]), keep)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    assert np.allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-12, atol=1e-12)
    if example == "attention_strict_causal.yaml":
        assert np.all(np.isneginf(got[:, :, 0]))


def test_a_wrong_statistic_fails_the_steps_numeric_check(monkeypatch):
    from compiler.ir import Bin, Read, Un
    from compiler.rules import fold_stat

    spec = load_spec_file(D64)
    for wrong in (lambda m, l: Bin("+", Read(m, ()), Read(l, ())),        # m + l: log forgotten
                  lambda m, l: Un("log", Read(l, ()))):                     # the max forgotten
        monkeypatch.setattr(fold_stat, "stat_value", wrong)
        with pytest.raises(DerivationError, match=r"numeric check failed: .* of LSE"):
            derive(spec, seed=5)


@pytest.mark.parametrize("change,reason", [
    # before ONLINE-AGG there is no (m, l) fold
    (lambda t: t.replace("  - {rule: split_softmax, def: P}\n",
                         "  - {rule: fold_stat, def: O, stat: LSE}\n  - {rule: split_softmax, def: P}\n"),
     "not a fold"),
    # LSE not declared as an output
    (lambda t: t.replace(", also: [{tensor: LSE, dtype: f32}]", ""), "not a further output"),
])
def test_preconditions_refuse_by_name(change, reason):
    text = change(with_lse("flash_attention_d64.yaml", "j <= i"))
    with pytest.raises(DerivationError, match=reason):
        derive(parse_spec_text(text), seed=1, check=False)


def test_a_statistic_of_another_shape_or_read_elsewhere_is_refused():
    text = with_lse("flash_attention_d64.yaml", "j <= i")
    transposed = text.replace('"LSE[b, h, i] = ', '"LSE[i, h, b] = ')
    with pytest.raises(DerivationError, match=r"LSE's shape \[N, H, B\] is not O's shape with dimensions left out"):
        derive(parse_spec_text(transposed), seed=1, check=False)
    read = text.replace('output: {tensor: O', '  - "Z[b, h, i] = LSE[b, h, i]"\noutput: {tensor: O')
    read = read.replace('output: {tensor: O', 'output: {tensor: O', 1)
    lines = read.splitlines()
    at = next(k for k, ln in enumerate(lines) if ln.startswith("output:"))
    z = next(k for k, ln in enumerate(lines) if '"Z[b, h, i]' in ln)
    lines.insert(at - 1 if z > at else at, lines.pop(z)) if z > at else None
    with pytest.raises(DerivationError, match="LSE is read by Z"):
        derive(parse_spec_text("\n".join(lines) + "\n"), seed=1, check=False)


def test_output_also_must_name_a_statement():
    text = with_lse("flash_attention_d64.yaml", "j <= i").replace("also: [{tensor: LSE", "also: [{tensor: LSX")
    with pytest.raises(SpecError, match=r"output.also\[0\].tensor.*did you mean"):
        derive(parse_spec_text(text), check=False)


def test_old_specs_keep_one_output():
    d = derive(load_spec_file(ROOT / "examples" / "flash_attention_d64.yaml"), check=False)
    assert d.final.also_outputs() == () and not d.final.defs[0].also


def _build(tmp_path: Path, text: str, name: str) -> Path:
    from compiler.cli import build_to

    f = tmp_path / f"{name}.yaml"
    f.write_text(text)
    out = tmp_path / name
    build_to(f, out, proofs=False)
    return out


def _kernel_draws(out: Path) -> list[dict]:
    steps = json.loads((out / "derivation.json").read_text())["steps"]
    return next(s for s in steps if s["rule"] == "kernel")["numeric"]["draws"]


@pytest.mark.parametrize("example,mask,mapping", [
    ("flash_attention_d64.yaml", "j <= i", "online_fold_mma_sync"),
    ("attention_strict_causal.yaml", "j < i", "online_fold_wgmma"),
])
def test_build_runs_both_outputs_through_the_kernel_step(tmp_path, example, mask, mapping):
    out = _build(tmp_path, with_lse(example, mask), "k")
    plan = json.loads((out / "plan.json").read_text())
    assert plan["mapping"] == mapping
    assert "store LSE[" in (out / "kir.txt").read_text()
    for draw in _kernel_draws(out):
        assert set(draw["outputs"]) == {"O", "LSE"} and draw["outputs"]["LSE"]["passed"]
        assert draw["outputs"]["LSE"]["rel_error"] <= 1e-5


def test_kernel_text_writes_minus_inf_for_a_row_without_keys(tmp_path):
    from codegen.build_dir import load_build
    from codegen.emu import run_printed

    out = _build(tmp_path, with_lse("attention_strict_causal.yaml", "j < i"), "strict")
    printed = load_build(out).printed
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 1, 70, 128)).astype(np.float16) for _ in range(3))
    o, lse = run_printed(printed, len(printed.variants) - 1, [q, k, v])
    want = logsumexp_rows(q.astype(np.float64), k.astype(np.float64), 1 / np.sqrt(128), lambda i, j: j < i)
    assert np.isneginf(lse[0, 0, 0]) and np.all(o[0, 0, 0] == 0)
    assert np.allclose(lse[0, 0, 1:], want[0, 0, 1:], rtol=1e-5, atol=1e-5)


def test_simt_prints_both_outputs_and_a_mapping_without_them_refuses_by_name(tmp_path, monkeypatch):
    from dataclasses import replace

    from codegen.kir.lower import UnsupportedMapping, lower
    from codegen.mappings import REGISTRY, print_kernel

    text = with_lse("flash_attention_d64.yaml", "j <= i")
    text = "\n".join(ln for ln in text.splitlines() if "rule: map_mma" not in ln) + "\n"
    text = text.replace("check_sizes: {B: 1, H: 2, N: 150}", "check_sizes: {B: 1, H: 1, N: 20}")
    out = _build(tmp_path, text, "simt")
    assert json.loads((out / "plan.json").read_text())["mapping"] == "simt"
    assert all(d["outputs"]["LSE"]["passed"] for d in _kernel_draws(out))
    kernel = lower(derive(parse_spec_text(text), check=False).final, "simt")
    for key, m in list(REGISTRY.items()):
        monkeypatch.setitem(REGISTRY, key, replace(m, prints_also=False))
    with pytest.raises(UnsupportedMapping, match=r"simt: does not print the kernel's further outputs \(LSE\)"):
        print_kernel(kernel, ())


def test_the_backward_reads_the_forwards_lse(example_build):
    b = example_build(ROOT / "examples" / "flash_attention_grad.yaml")  # the run's shared build (seed 0)
    assert b.rc == 0, b.stderr
    out = b.out
    manifest = json.loads((out / "grad.json").read_text())
    assert sorted(manifest["saved"]) == ["LSE", "O"]
    assert [k["name"] for k in manifest["kernels"]] == ["dV", "dK", "dQ"]
    assert all("LSE" in k["inputs"] for k in manifest["kernels"])
    assert manifest["grad"]["saved"] and all(r["rel_error"] <= 1e-12 for r in manifest["grad"]["saved"])

    import derivc

    t = derivc.load_training(out, device="emu")
    rng = np.random.default_rng(2)
    x = {n: rng.standard_normal((1, 2, 37, 64)).astype(np.float16) for n in ("Q", "K", "V")}
    o, saved = t.forward_with_saved(**x)
    assert set(saved) == {"Q", "K", "V", "O", "LSE"} and saved["O"] is o
    want = logsumexp_rows(*(x[n].astype(np.float64) for n in ("Q", "K")), 1 / 8, lambda i, j: j <= i)
    assert np.allclose(saved["LSE"], want, rtol=1e-5, atol=1e-5)
    grads = t.backward(saved, rng.standard_normal(o.shape).astype(np.float16))
    assert set(grads) == {"Q", "K", "V"} and all(np.all(np.isfinite(g)) for g in grads.values())
