"""General scores and masks on the H200 against float64: the scale on the right, Gemma-2 logit
soft-capping (logits x1, x8, x30), generated compositions, prefix-LM (j <= i || j < Prefix, Prefix
passed by name: 0, 1, 100, 1024, past N), on both tensor-core fold mappings (wgmma: the examples'
schedule; mma.sync: flash_attention.yaml's without skip_masked), odd lengths (1, 77, 333, 1000).

The reference is torch in float64 written from the formula (not from the IR), and the program's
own float64 interpreter.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

EX = Path(__file__).resolve().parents[2] / "examples"
LENGTHS = (1, 77, 333, 1000)
QK = "sum(e: Q[b, h, i, e] * K[b, h, j, e])"


def _spec(example: str, mapping: str, score: str | None = None, tag: str = "") -> tuple[str, dict]:
    spec = yaml.safe_load((EX / f"{example}.yaml").read_text())
    if score is not None:
        spec["statements"][0] = f"S[b, h, i, j] = {score}"
    if mapping == "mma_sync":
        other = yaml.safe_load((EX / "flash_attention.yaml").read_text())["schedule"]
        skip = any(st["rule"] == "skip_masked" for st in spec["schedule"])
        spec["schedule"] = [st for st in other if st["rule"] != "skip_masked" or skip]
    spec["name"] = f"{spec['name']}{tag}_{mapping}"
    return spec["name"], spec


def _torch_ref(example: str, q, k, v, prefix: int = 0):
    """The formula in float64: causal (or prefix-LM) softmax of the score, times V."""
    q, k, v = q.double(), k.double(), v.double()
    s = torch.einsum("bhie,bhje->bhij", q, k) / math.sqrt(q.shape[-1])
    if example == "attention_softcap":
        s = 30 * torch.tanh(s / 30)
    n = q.shape[2]
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    keep = (j <= i) | (j < prefix) if example == "attention_prefix_lm" else (j <= i)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


CASES = [_spec(x, m) for x in ("attention_scale_right", "attention_softcap") for m in ("wgmma", "mma_sync")]
GENERATED = [_spec("flash_attention_wgmma", m, s, f"_gen{n}") for n, s in enumerate((
    f"20 * tanh({QK} * 0.125 / 20) + 0.5 * (j - i) / 64",
    f"max({QK} / sqrt(D), -3) - 2",
    f"-(0.5 * {QK}) * (1 + 0.01 * (i - j)) / 8",
)) for m in ("wgmma", "mma_sync")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from derivc_testing import spec_builder

    return spec_builder(tmp_path_factory.mktemp("scores"))


def _run(built, name, spec, n, seed, scale, sizes_extra=None):
    from codegen.run_cmd import random_inputs_torch
    from compiler.interp import run_program

    derivation, kernel = built(name, spec)
    program = derivation.programs[0]
    sizes = {**{k: v for k, v in program.sizes if v is not None}, "B": 2, "H": 3, "N": n, **(sizes_extra or {})}
    xs = random_inputs_torch(program, sizes, seed, scale)
    out = torch.full((2, 3, n, 128), float("nan"), device="cuda", dtype=torch.float16)
    kernel(*[xs[t] for t in kernel.inputs], out=out, **{k: v for k, v in (sizes_extra or {}).items()})
    torch.cuda.synchronize()
    ref = run_program(program, sizes, {k: x.double().cpu().numpy() for k, x in xs.items()})[program.output]
    return kernel, xs, out, ref


@pytest.mark.parametrize("name,spec", CASES + GENERATED, ids=[n for n, _ in CASES + GENERATED])
def test_score_matches_float64(built, name, spec):
    from codegen.run_cmd import TOLERANCE
    from compiler.interp import rel_error

    example = next((x for x in ("attention_softcap", "attention_scale_right") if name.startswith(x)), None)
    scales = (1.0, 8.0, 30.0) if example == "attention_softcap" else (1.0, 8.0)
    for n in LENGTHS:
        for seed, scale in enumerate(scales, 1):
            kernel, xs, out, ref = _run(built, name, spec, n, seed, scale)
            got = out.double().cpu().numpy()
            where = f"{name} N={n} x{scale:g}"
            assert not (got != got).any(), f"{where}: NaN in the output"
            err = rel_error(got, ref)
            assert err <= TOLERANCE["f16"], f"{where}: rel error {err:.3e} (vs the interpreter)"
            if example is not None:
                formula = _torch_ref(example, xs["Q"], xs["K"], xs["V"]).cpu().numpy()
                err = rel_error(got, formula)
                assert err <= TOLERANCE["f16"], f"{where}: rel error {err:.3e} (vs the formula)"


PREFIX = [_spec("attention_prefix_lm", m) for m in ("wgmma", "mma_sync")]


@pytest.mark.parametrize("name,spec", PREFIX, ids=[n for n, _ in PREFIX])
def test_prefix_lm_matches_float64(built, name, spec):
    """One kernel, the prefix given by name at each call; against the formula in float64."""
    from codegen.run_cmd import TOLERANCE
    from compiler.interp import rel_error

    for n in LENGTHS:
        for prefix in (0, 1, 100, 1024, n + 5):
            for seed, scale in ((1, 1.0), (2, 8.0)):
                kernel, xs, out, ref = _run(built, name, spec, n, seed + prefix, scale, {"Prefix": prefix})
                got = out.double().cpu().numpy()
                where = f"{name} N={n} Prefix={prefix} x{scale:g}"
                assert not (got != got).any(), f"{where}: NaN in the output"
                assert rel_error(got, ref) <= TOLERANCE["f16"], f"{where}: vs the interpreter"
                formula = _torch_ref("attention_prefix_lm", xs["Q"], xs["K"], xs["V"], prefix).cpu().numpy()
                err = rel_error(got, formula)
                assert err <= TOLERANCE["f16"], f"{where}: rel error {err:.3e} (vs the formula)"
