"""Attention variants (strict causal, sliding window, ALiBi, bias tensor) on the H200 against the
spec in float64: odd lengths (1, 77, 333, 1000), fully masked rows, logits x8; a window W that is
a kernel argument (`W: dynamic`, passed by name at the call) at several values.

Each example is built as `derivc build` builds it; windows that cut at these lengths (W = 1, 100)
and an f32 bias are the same specs with one size / dtype edited, and each variant also runs on the
mma.sync fold mapping (the schedule of flash_attention.yaml).  Rows that the mask leaves empty
(strict causal: query 0) must be exactly 0; the rest within the output dtype's tolerance of IR₀
in float64.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
LENGTHS = (1, 77, 333, 1000)


def _variant(name: str, **edit) -> tuple[str, dict]:
    spec = yaml.safe_load((EX / f"{name}.yaml").read_text())
    if "W" in edit:
        spec["sizes"]["W"] = edit["W"]
        if edit["W"] == "dynamic":
            spec["check_sizes"]["W"] = 37
    if "bias_dtype" in edit:
        spec["inputs"]["Bias"]["dtype"] = edit["bias_dtype"]
    if "schedule" in edit:  # the same spec on another mapping (attention_bias has no mask to skip)
        other = yaml.safe_load((EX / f"{edit['schedule']}.yaml").read_text())["schedule"]
        spec["schedule"] = [st for st in other if st["rule"] != "skip_masked" or "softmax(j |" in spec["statements"][1]]
    tag = "_".join(f"{k}{v}" for k, v in sorted(edit.items()))
    spec["name"] = spec["name"] + ("_" + tag if tag else "")
    return spec["name"], spec


WGMMA = [_variant("attention_strict_causal"), _variant("attention_sliding_window"),
         _variant("attention_sliding_window", W=1), _variant("attention_sliding_window", W=100),
         _variant("attention_alibi"), _variant("attention_bias"), _variant("attention_bias", bias_dtype="f32")]
MMA_SYNC = [_variant(n, schedule="flash_attention", **e) for n, e in (
    ("attention_strict_causal", {}), ("attention_sliding_window", {"W": 100}), ("attention_alibi", {}),
    ("attention_bias", {}))]
VARIANTS = WGMMA + MMA_SYNC


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from derivc_testing import spec_builder

    return spec_builder(tmp_path_factory.mktemp("variants"))


@pytest.mark.parametrize("name,spec", VARIANTS, ids=[n for n, _ in VARIANTS])
def test_variant_matches_the_spec(built, name, spec):
    from codegen.run_cmd import TOLERANCE, random_inputs_torch
    from compiler.interp import rel_error, run_program

    derivation, kernel = built(name, spec)
    program = derivation.programs[0]
    assert kernel.plan.mma == ("mma_sync" if "schedule" in name else "wgmma")
    for n in LENGTHS:
        for seed, scale in ((1, 1.0), (2, 8.0)):  # x8: large logits
            sizes = {**{k: v for k, v in program.sizes if v is not None}, "B": 2, "H": 3, "N": n}
            xs = random_inputs_torch(program, sizes, seed, scale)
            out = torch.full((2, 3, n, 128), float("nan"), device="cuda", dtype=torch.float16)
            kernel(*[xs[t] for t in kernel.inputs], out=out)
            torch.cuda.synchronize()
            ref = run_program(program, sizes, {k: x.double().cpu().numpy() for k, x in xs.items()})[program.output]
            got = out.double().cpu().numpy()
            where = f"{name} N={n} x{scale:g}"
            assert not (got != got).any(), f"{where}: NaN in the output"
            empty = (abs(ref).max(axis=-1) == 0)
            assert (got[empty] == 0).all(), f"{where}: a fully masked row is not 0"
            err = rel_error(got, ref)
            assert err <= TOLERANCE["f16"], f"{where}: rel error {err:.3e}"
    if name.startswith("attention_strict_causal"):
        assert empty[:, :, 0].all() and not empty[:, :, 1:].any()  # query 0 sees no key


def test_rows_that_see_no_key_are_zero(built):
    """Strict causal: query 0 sees no key, on both mappings (large logits)."""
    from codegen.run_cmd import random_inputs_torch

    for name, spec in (WGMMA[0], MMA_SYNC[0]):
        d, kernel = built(name, spec)
        xs = random_inputs_torch(d.programs[0], {"B": 1, "H": 2, "N": 333, "D": 128}, 3, 8.0)
        out = kernel(*[xs[t] for t in kernel.inputs])
        assert torch.count_nonzero(out[:, :, :1]) == 0 and torch.count_nonzero(out[:, :, 1:]) > 0, name


@pytest.mark.parametrize("name,spec", [_variant("attention_sliding_window", W="dynamic"),
                                       _variant("attention_sliding_window", W="dynamic", schedule="flash_attention")],
                         ids=["wgmma", "mma_sync"])
def test_window_passed_at_the_call(built, name, spec):
    """One kernel, W given by name at each call (no input's shape holds it): W = 1, 100, 1024 at
    N = 1000, against float64; leaving W out is refused by name before any launch."""
    from codegen.run_cmd import TOLERANCE, random_inputs_torch
    from compiler.interp import rel_error, run_program

    derivation, kernel = built(name, spec)
    program = derivation.programs[0]
    assert "W" in kernel.kir.dynamic()
    sizes = {"B": 2, "H": 3, "N": 1000, "D": 128}
    xs = random_inputs_torch(program, {**sizes, "W": 1}, 4, 8.0)
    args = [xs[t] for t in kernel.inputs]
    with pytest.raises(ValueError, match="pass it by name"):
        kernel(*args)
    for w in (1, 100, 1024):
        got = kernel(*args, W=w).double().cpu().numpy()
        ref = run_program(program, {**sizes, "W": w}, {k: x.double().cpu().numpy() for k, x in xs.items()})[program.output]
        err = rel_error(got, ref)
        assert err <= TOLERANCE["f16"], f"{name} W={w}: rel error {err:.3e}"
