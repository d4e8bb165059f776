"""Per-step obligations of the backward rewrites (compiler/obligations_bwd.py): RECOMPUTE and
SOFTMAX-ROWTERM steps of a gradient schedule export a StepNN file that instantiates
softmax_recompute / softmax_bwd_rowterm at the step's site, and coqc checks it; a rewrite with a
wrong site (LSE without log, P without its mask, L over masked keys, the row term reading the
wrong element of O or G) must fail coqc.  The derivation runs without its numeric checks (so the
obligation is the only check a mutated step meets)."""
from __future__ import annotations

import json
import types
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from compiler import obligations
from compiler.derive_grad import derive_gradient
from compiler.ir import Aff, Bin, Read, Reduce, Select, Un, replace_reads, walk
from compiler.rules import RULES
from compiler.spec import parse_spec_text
from proofs_ci import coqlib

pytestmark = pytest.mark.skipif(not coqlib.coqc_available(), reason="coqc not installed")


def _spec(mask: str | None) -> str:
    guard = f" | {mask}" if mask else ""
    return yaml.safe_dump({
        "name": "attention_grad", "sizes": {"N": "dynamic", "D": 8},
        "inputs": {x: {"shape": ["N", "D"], "dtype": "f32"} for x in ("Q", "K", "V")},
        "statements": ["S[i, j] = sum(e: Q[i, e] * K[j, e])",
                       f"P[i, j] = softmax(j{guard}: S[i, j])",
                       "O[i, d] = sum(j: P[i, j] * V[j, d])"],
        "output": {"tensor": "O", "dtype": "f32"}, "check_sizes": {"N": 11},
        "grad": {"of": "O", "wrt": ["Q", "K", "V"],
                 "schedule": [{"rule": "recompute", "def": "P"},
                              {"rule": "softmax_rowterm", "def": "dS", "probs": "P", "output": "O"}],
                 "kernels": [{"output": "dQ", "schedule": []}, {"output": "dK", "schedule": []},
                             {"output": "dV", "schedule": []}]}}, sort_keys=False)


@pytest.fixture(scope="module")
def coq_lib(tmp_path_factory) -> Path:
    return coqlib.build_library(out_dir=tmp_path_factory.mktemp("coqlib_bwd_ob") / "coq")


def _obligations(mask: str | None, out: Path) -> dict[str, tuple[Path, dict]]:
    gd = derive_gradient(parse_spec_text(_spec(mask)), "attention_grad.yaml", check=False, seed=3)
    obligations.write_obligations(gd.shared, out)
    index = json.loads((out / "index.json").read_text())["steps"]
    return {e["rule"]: (out / e["files"]["coq"], e) for e in index}


def _coqc(v: Path, lib: Path) -> tuple[bool, str]:
    r = coqlib.check_obligation(v, lib)
    return r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("mask", ["j <= i", None], ids=["causal", "unmasked"])
def test_backward_steps_export_and_check(coq_lib, tmp_path, mask):
    obs = _obligations(mask, tmp_path / "proofs")
    for rule, theorem in (("recompute", "softmax_recompute"), ("softmax_rowterm", "softmax_bwd_rowterm")):
        v, entry = obs[rule]
        assert entry["status"] == "full", entry
        assert entry["theorem"] == theorem
        text = v.read_text()
        assert f"apply ({theorem}" in text or f"apply {theorem}" in text
        assert v.with_suffix(".lean").exists()
        ok, out = _coqc(v, coq_lib)
        assert ok, f"{rule}: {out}"
    recompute = obs["recompute"][0].read_text()
    assert "{KL : KAlgLog R}" in recompute and "eadd" in recompute and "(log (sumTo" in recompute
    assert "[KAlgLog R]" in obs["recompute"][0].with_suffix(".lean").read_text()


def _patch(monkeypatch, rule: str, mutate) -> None:
    r = RULES[rule]
    orig = type(r).rewrite

    def bad(self, prog, p, facts):
        new = orig(self, prog, p, facts)
        mutated = mutate(new, facts)
        assert mutated != new, "the mutation changed nothing"
        return mutated

    monkeypatch.setattr(r, "rewrite", types.MethodType(bad, r))


def _map_def(prog, name: str, f):
    return prog.with_def(replace(prog.def_named(name), body=f(prog.def_named(name).body)))


def _lse_without_log(prog, facts):
    return _map_def(prog, facts["lse"], lambda b: Bin(b.op, b.a, b.b.a) if isinstance(b.b, Un) else b)


def _p_without_mask(prog, facts):
    return _map_def(prog, "P", lambda b: b.then if isinstance(b, Select) else b)


def _l_over_masked_keys(prog, facts):
    def unmask(b):
        red = b.b.a
        assert isinstance(red, Reduce) and isinstance(red.body, Select)
        return Bin(b.op, b.a, Un("log", replace(red, body=red.body.then)))
    return _map_def(prog, facts["lse"], unmask)


def _o_transposed(prog, facts):
    """The row term reads O[d, i] instead of O[i, d]."""
    return _map_def(prog, "dS", lambda b: replace_reads(b, facts["output"],
                                                        lambda r: Read(r.tensor, (r.idx[1], r.idx[0]))))


def _g_at_column_zero(prog, facts):
    g = next(x for x in walk(facts["replacement"]) if isinstance(x, Read) and x.tensor != facts["output"])
    return _map_def(prog, "dS", lambda b: replace_reads(b, g.tensor, lambda r: Read(r.tensor, (r.idx[0], Aff.lit(0)))))


@pytest.mark.parametrize("rule,mutate,mask", [
    ("recompute", _lse_without_log, "j <= i"),
    ("recompute", _lse_without_log, None),
    ("recompute", _p_without_mask, "j <= i"),
    ("recompute", _l_over_masked_keys, "j <= i"),
    ("softmax_rowterm", _o_transposed, "j <= i"),
    ("softmax_rowterm", _g_at_column_zero, None),
], ids=["lse-without-log", "lse-without-log-unmasked", "p-without-mask", "l-over-masked-keys",
        "rowterm-o-transposed", "rowterm-g-column-zero"])
def test_wrong_backward_site_fails_coqc(coq_lib, tmp_path, monkeypatch, rule, mutate, mask):
    _patch(monkeypatch, rule, mutate)
    v, entry = _obligations(mask, tmp_path / "proofs")[rule]
    assert entry["status"] == "full", entry
    ok, _ = _coqc(v, coq_lib)
    assert not ok, f"{rule}: a wrong site passed coqc"


def test_example_backward_schedule_and_lse_kernel_safety(coq_lib, tmp_path):
    """examples/flash_attention_grad.yaml: its grad.schedule (RECOMPUTE, softmax_rowterm) and the
    LSE kernel's safety obligation (exp(s - M) under the causal mask, M the masked row max:
    derivc_ele's masked-max case, ele_maxTo_sel) pass coqc."""
    from compiler.spec import load_spec_file

    path = Path(__file__).resolve().parents[1] / "examples" / "flash_attention_grad.yaml"
    gd = derive_gradient(load_spec_file(path), str(path), check=False, seed=3)
    obligations.write_obligations(gd.shared, tmp_path / "shared")
    steps = json.loads((tmp_path / "shared" / "index.json").read_text())["steps"]
    assert [s["theorem"] for s in steps] == ["softmax_recompute", "softmax_bwd_rowterm"]
    lse = next(k for k in gd.kernels if k.grad_kernel == "LSE")
    obligations.write_obligations(lse, tmp_path / "LSE")
    safety = json.loads((tmp_path / "LSE" / "index.json").read_text())["safety"]
    assert safety["status"] == "full" and safety["coq_theorems"]
    for v in [tmp_path / "shared" / s["files"]["coq"] for s in steps] + [tmp_path / "LSE" / safety["files"]["coq"]]:
        ok, out = _coqc(v, coq_lib)
        assert ok, f"{v.name}: {out}"
