"""examples/attention_bottom_right_causal_grad.yaml (NQ != NK, query i sees keys j <= i + NK - NQ)
built at check sizes NQ < NK over several tiles (the example's own check sizes have NQ > NK), its
backward kernels on wgmma, and forward + backward run through the CPU emulation against
float64 at NQ > NK (a whole 64-row query tile and part of the next see no key: exact zeros in O
and dQ, no NaN) and NQ < NK."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "attention_bottom_right_causal_grad.yaml"
CHECK = "check_sizes: {B: 1, H: 1, NQ: 150, NK: 140}"

pytestmark = pytest.mark.slow  # one build with every backward kernel run on the CPU, then the emulation


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bottom_right")
    text = EXAMPLE.read_text()
    assert CHECK in text
    spec = root / EXAMPLE.name
    spec.write_text(text.replace(CHECK, "check_sizes: {B: 1, H: 1, NQ: 70, NK: 150}"))
    proc = subprocess.run([sys.executable, "-m", "compiler", "build", str(spec), "-o", str(root / "build"),
                           "--no-proofs", "--seed", "3"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "build"


def test_backward_kernels_are_on_wgmma_and_checked_at_nq_below_nk(built):
    manifest = json.loads((built / "grad.json").read_text())
    assert [k["name"] for k in manifest["kernels"]] == ["Dsum", "dV", "dQ"]  # dK beside dV
    assert sorted(manifest["saved"]) == ["LSE", "O"]
    for k in ("dV", "dQ"):
        assert json.loads((built / "grad" / k / "plan.json").read_text())["mapping"] == "score_sum_wgmma", k
        steps = json.loads((built / "grad" / k / "derivation.json").read_text())["steps"]
        kernel = steps[-1]
        assert kernel["rule"] == "kernel" and all(d["passed"] for d in kernel["numeric"]["draws"]), k
        assert any(d["sizes"]["NQ"] == 70 and d["sizes"]["NK"] == 150 for d in kernel["numeric"]["draws"]), k
        scales = [s["numeric"]["error_scale"] for s in steps if s.get("numeric") and "error_scale" in s["numeric"]]
        assert scales and set(scales) == {"terms"}, k  # the schedule's steps, against the terms' magnitude


def _reference(q, k, v, do):
    """float64 O, dQ, dK, dV of sum(O * dO) under the bottom-right mask (a row without a key: 0)."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    keep = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq
    s = np.where(keep, q @ np.swapaxes(k, -1, -2) / np.sqrt(d), -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    z = e.sum(-1, keepdims=True)
    p = e / np.where(z > 0, z, 1.0)
    o = p @ v
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return o, {"Q": ds @ k / np.sqrt(d), "K": np.swapaxes(ds, -1, -2) @ q / np.sqrt(d), "V": np.swapaxes(p, -1, -2) @ do}


@pytest.mark.parametrize("nq,nk", [(150, 70), (70, 150)])
def test_emulated_forward_and_backward_match_float64(built, nq, nk):
    import derivc

    t = derivc.load_training(built, device="emu")
    rng = np.random.default_rng(nq)
    q, do = (rng.standard_normal((1, 1, nq, 128)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((1, 1, nk, 128)).astype(np.float16) for _ in range(2))
    o, saved = t.forward_with_saved(Q=q, K=k, V=v)
    grads = t.backward(saved, do)
    o_ref, g_ref = _reference(q, k, v, do)
    assert np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref) < 5e-3
    for x in ("Q", "K", "V"):
        assert np.all(np.isfinite(grads[x])), x
        err = np.linalg.norm(grads[x].astype(np.float64) - g_ref[x]) / np.linalg.norm(g_ref[x])
        assert err < 5e-3, (x, err)
    empty = max(nq - nk, 0)  # rows that see no key
    assert np.all(o[..., :empty, :] == 0) and np.all(grads["Q"][..., :empty, :] == 0)
    assert np.all(saved["LSE"][..., :empty] == -np.inf) and np.all(np.isfinite(saved["LSE"][..., empty:]))
