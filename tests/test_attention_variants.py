"""Attention variants as specs (strict causal, sliding window, ALiBi slopes, a bias tensor) on the
tensor-core fold mappings, without a GPU.

- every example builds through NVRTC and its SASS promises; the score term and the window reach
  the kernel as printed conditions / expressions;
- the key-tile range the wgmma kernel runs ([n_start, n_start + n_tiles): the MASK rule's extent and
  the first tile the mask reaches) is compiled with the host compiler from the very C text the
  template prints and compared, for generated masks (every comparison, constants, fixed and
  dynamic sizes), with a brute-force evaluation of the mask over every element of every tile:
  no skipped tile holds a kept element; the count of skipped tiles is reported;
- mutations (the first tile one too late, the window's slack at the wrong corner, the slope's sign)
  are caught.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from codegen.kir.lower import lower
from codegen.mappings import online_fold
from codegen.cuda.nvrtc import nvrtc_available
from compiler.derive import derive
from compiler.ir import Bin, Un
from compiler.spec import load_spec_file
from derivc_testing import build_spec as build

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
VARIANTS = ["attention_strict_causal", "attention_sliding_window", "attention_alibi", "attention_bias"]


@pytest.mark.skipif(not nvrtc_available(), reason="no NVRTC")
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_builds_through_nvrtc_and_sass(tmp_path, name):
    code, err, out = build(tmp_path, EX / f"{name}.yaml")
    assert code == 0, err
    src = (out / "kernel.cu").read_text()
    plan = json.loads((out / "plan.json").read_text())
    sass = json.loads((out / "sass.json").read_text())
    assert plan["mapping"] == "online_fold_wgmma"
    assert "wgmma" in json.dumps(sass).lower()
    assert "C7513" not in (out / "compile.log").read_text(), "ptxas serialized the wgmma pipeline"
    args = plan["variants"][0]["args"]
    if name == "attention_alibi":
        assert args[:5] == ["Q", "K", "V", "Slope", "O"]
        # Slope[h] once per block, then j - i as float adds of the absolute column and row
        assert "const float t_u0 = " in src and "p_x0[" in src
        assert "t_u0 * (-1.0f * rowf + 1.0f * colf)" in src
    elif name == "attention_bias":
        assert args[:5] == ["Q", "K", "V", "Bias", "O"]
        assert "f16_to_f32(p_x0[" in src and "(unsigned long long)" in src  # guarded read
    elif name == "attention_sliding_window":
        assert "< (1024)" in src  # the window condition, printed
        assert "const int n_start = (int)(max(0LL, " in src  # the range starts at the window
    else:
        assert "const int n_start = (int)(0LL);" in src
        assert ") < ((row - q0) + 128 * qt)" in src  # strict j < i


# --------------------------------------------------------------------------- key-tile range

MASKS = [  # (condition, sizes): comparisons of every kind, constants, fixed and dynamic sizes
    ("j <= i && i - j < W", {"W": 1024}),
    ("j <= i && i - j < W", {"W": "dynamic"}),
    ("j < i && i - j <= W", {"W": 300}),
    ("j >= i - W && j <= i", {"W": "dynamic"}),
    ("i - 200 < j && j < i + 50", {}),
    ("j > i - W", {"W": "dynamic"}),
    ("i >= j && j >= i - 129", {}),
    ("j == i", {}),
    ("j <= i + 3 && j + W >= i", {"W": 64}),
    ("2 * j > i && j <= i", {}),
]


def _random_masks(n: int, seed: int) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        sizes: dict = {}
        for _ in range(rng.randint(1, 3)):
            op = rng.choice(["<", "<=", ">", ">=", "=="])
            a, b = rng.choice([(1, 1), (1, 2), (2, 1)])
            c = rng.choice(["0", "5", "130", "W", "-W", "-77"])
            if "W" in c:
                sizes["W"] = rng.choice(["dynamic", rng.randint(0, 600)])
            lhs = "j" if a == 1 else f"{a} * j"
            rhs = ("i" if b == 1 else f"{b} * i") + ("" if c == "0" else f" + {c}" if not c.startswith("-") else f" - {c[1:]}")
            parts.append(f"{lhs} {op} {rhs}")
        out.append((" && ".join(parts), sizes))
    return out


def _spec(cond: str, sizes: dict, skip: bool) -> dict:
    spec = yaml.safe_load((EX / "attention_sliding_window.yaml").read_text())
    spec["name"] = "range_probe"
    spec["sizes"] = {"B": "dynamic", "H": "dynamic", "N": "dynamic", "D": 128, **sizes}
    spec["statements"][1] = f"P[b, h, i, j] = softmax(j | {cond}: S[b, h, i, j])"
    spec["check_sizes"] = {"B": 1, "H": 1, "N": 140, **({"W": 70} if sizes.get("W") == "dynamic" else {})}
    if not skip:
        spec["schedule"] = [s for s in spec["schedule"] if s["rule"] != "skip_masked"]
    return spec


def _printed_range(tmp_path: Path, cond: str, sizes: dict) -> tuple[str, str, dict, int, int]:
    """(n_start C, extent C, fixed sizes, BM, BN) as the wgmma template prints them."""
    for skip in (True, False):
        spec = _spec(cond, sizes, skip)
        path = tmp_path / "probe.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        s = load_spec_file(path)
        try:
            d = derive(s, str(path), seed=5, check=False)
        except Exception as exc:  # the MASK rule refuses a mask with no upper bound on the key tile
            if skip and "skip_masked" in str(exc) or "nothing can be skipped" in str(exc):
                continue
            raise
        k = lower(d.final, s.name)
        plan, mask = online_fold.match(k, "online_fold wgmma")
        ctx = online_fold.mask_context(mask, plan)
        return ctx["n_start_expr"], ctx["n_tiles_expr"], dict(plan.fixed), plan.block_m, plan.block_n
    raise AssertionError(f"{cond}: no derivation")


def _host_eval(tmp_path: Path, cases: list[tuple[str, str]], points: list[tuple[int, int, int]]) -> list[list[tuple[int, int]]]:
    """Compile the printed C of each case's (n_start, extent) and evaluate it at (qt, N, W)."""
    fns = []
    for n, (start, ext) in enumerate(cases):
        fns.append(f"static void f{n}(long long qt, long long sz_N, long long sz_W, long long* s, long long* e) "
                   f"{{ (void)sz_W; (void)sz_N; *s = (long long)({start}); *e = (long long)({ext}); }}")
    calls = "\n".join(f"    f{n}(qt, N, W, &s, &e); printf(\"%lld %lld \", s, e);" for n in range(len(cases)))
    src = ("#include <cstdio>\n#include <algorithm>\nusing std::max; using std::min;\n" + "\n".join(fns) +
           "\nint main() { long long qt, N, W, s, e;\n while (scanf(\"%lld %lld %lld\", &qt, &N, &W) == 3) {\n"
           + calls + "\n    printf(\"\\n\"); }\n return 0; }\n")
    (tmp_path / "range.cpp").write_text(src)
    subprocess.run(["g++", "-O0", "-o", str(tmp_path / "range"), str(tmp_path / "range.cpp")], check=True)
    res = subprocess.run([str(tmp_path / "range")], input="".join(f"{q} {n} {w}\n" for q, n, w in points),
                         capture_output=True, text=True, check=True)
    out = []
    for line in res.stdout.splitlines():
        v = list(map(int, line.split()))
        out.append([(v[2 * c], v[2 * c + 1]) for c in range(len(cases))])
    return out


def _keep_tile(cond: str, qt: int, kt: int, bm: int, bn: int, n: int, w: int) -> bool:
    import numpy as np

    i = np.arange(qt * bm, min(n, qt * bm + bm))[:, None]
    j = np.arange(kt * bn, min(n, kt * bn + bn))[None, :]
    if i.size == 0 or j.size == 0:
        return False
    terms = [t.strip() for t in cond.split("&&")]
    ok = np.ones((i.shape[0], j.shape[1]), dtype=bool)
    for t in terms:  # a disjunction a || b evaluates as (a) | (b)
        t = " | ".join(f"({p})" for p in t.split("||"))
        ok &= np.broadcast_to(eval(t.replace("W", f"({w})"), {}, {"i": i, "j": j}), ok.shape)  # noqa: S307
    return bool(ok.any())


def _check(tmp_path: Path, masks: list[tuple[str, dict]]) -> tuple[int, int, int]:
    printed = [_printed_range(tmp_path, c, s) for c, s in masks]
    bm = printed[0][3]
    points = [(qt, N, W) for N in (1, 77, 333, 1000) for W in (0, 1, 100, 700) for qt in range(-(-N // bm))]
    rows = _host_eval(tmp_path, [(p[0], p[1]) for p in printed], points)
    checked = dead = skipped = 0
    for (qt, N, W), row in zip(points, rows):
        for (cond, _), (_, _, fixed, bm_, bn), (start, end) in zip(masks, printed, row):
            if "W" in fixed and W != 0:
                continue  # a fixed W: the size W of the call does not matter, one pass
            w = fixed.get("W", W)
            for kt in range(-(-N // bn)):
                live = _keep_tile(cond, qt, kt, bm_, bn, N, w)
                run = start <= kt < end
                checked += 1
                dead += not live
                skipped += not run
                if live and not run:
                    raise AssertionError(f"{cond} (W={w}, N={N}): key tile {kt} of query tile {qt} holds a kept "
                                         f"element but the printed range is [{start}, {end})")
    return checked, dead, skipped


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_printed_key_tile_range_never_skips_a_kept_element(tmp_path, capsys):
    masks = MASKS + _random_masks(10, seed=11)
    checked, dead, skipped = _check(tmp_path, masks)
    with capsys.disabled():
        print(f"\n[key-tile range] {len(masks)} masks, {checked} (query tile, key tile) pairs: "
              f"{dead} fully masked, {skipped} skipped by the printed range")
    assert skipped > dead // 2  # the window's lower end and MASK's upper end both skip


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
@pytest.mark.parametrize("mutation", ["late_start", "wrong_corner"])
def test_a_wrong_first_tile_is_caught(tmp_path, monkeypatch, mutation):
    """Mutate the first-tile printer once: the brute force finds a kept element outside the range."""
    from codegen.mappings import cexpr

    real = cexpr.first_tile_c

    def mutated(conds, var, box, names):
        if mutation == "late_start":
            return f"({real(conds, var, box, names)} + 1)"
        swapped = {v: (hi, lo) for v, (lo, hi) in box.items()}  # the slack at its least corner
        return real(conds, var, swapped, names)

    monkeypatch.setattr(cexpr, "first_tile_c", mutated)
    with pytest.raises(AssertionError, match="holds a kept element"):
        _check(tmp_path, [("j <= i && i - j < W", {"W": "dynamic"})])


def test_the_slope_sign_reaches_the_printed_term(tmp_path):
    """ALiBi's Slope[h] * (j - i) and the mutated (i - j) print opposite index values; a score term
    that is subtracted keeps its sign (QK - T prints -(T))."""
    spec = yaml.safe_load((EX / "attention_alibi.yaml").read_text())
    texts = []
    for stmt in (spec["statements"][0], spec["statements"][0].replace("(j - i)", "(i - j)"),
                 spec["statements"][0].replace("+ Slope", "- Slope")):
        spec["statements"][0] = stmt
        spec["name"] = "alibi_sign"
        path = tmp_path / "a.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        s = load_spec_file(path)
        k = lower(derive(s, str(path), seed=5, check=False).final, s.name)
        plan, mask = online_fold.match(k, "online_fold wgmma")
        texts.append(online_fold.mask_context(mask, plan)["score_value"]("s", "row", "col", "kt", "rowf", "colf"))
    qk = "(0.0883883461356163f * s)"
    assert texts[0] == f"({qk} + (t_u0 * (-1.0f * rowf + 1.0f * colf)))", texts[0]
    assert texts[1] == f"({qk} + (t_u0 * (1.0f * rowf + -1.0f * colf)))", texts[1]
    assert texts[2] == f"({qk} - (t_u0 * (-1.0f * rowf + 1.0f * colf)))", texts[2]


def test_a_term_that_is_not_element_wise_is_refused_by_name(tmp_path):
    spec = yaml.safe_load((EX / "attention_alibi.yaml").read_text())
    k_ok = _kernel(tmp_path, spec)
    loop = next(s for s in k_ok.body if type(s).__name__ == "TileLoop")
    s_c = next(s for s in loop.body if type(s).__name__ == "Compute")
    from dataclasses import replace

    from compiler.ir import Const, Reduce, Select
    from compiler.ir import Ext as IExt
    sel = s_c.value
    assert isinstance(sel, Select) and isinstance(sel.then, Bin)
    bad_term = Reduce("sum", "zz", IExt.of(4), Const(1.0))  # a reduction inside the term
    bad = replace(s_c, value=replace(sel, then=Bin("+", sel.then.a, bad_term)))
    k_bad = replace(k_ok, body=tuple(replace(loop, body=tuple(bad if x is s_c else x for x in loop.body))
                                     if x is loop else x for x in k_ok.body))
    with pytest.raises(Exception, match="holds 2 reductions"):
        online_fold.match(k_bad, "online_fold wgmma")
    neg = replace(s_c, value=replace(sel, then=Bin("+", sel.then.a, Un("neg", sel.then.b))))
    k_neg = replace(k_ok, body=tuple(replace(loop, body=tuple(neg if x is s_c else x for x in loop.body))
                                     if x is loop else x for x in k_ok.body))
    online_fold.match(k_neg, "online_fold wgmma")  # an element-wise term is accepted


def test_inputs_out_of_order_are_refused_by_name(tmp_path):
    spec = yaml.safe_load((EX / "attention_alibi.yaml").read_text())
    spec["inputs"] = {"Slope": spec["inputs"]["Slope"], **{k: v for k, v in spec["inputs"].items() if k != "Slope"}}
    code, err, _ = build(tmp_path, {**spec, "name": "alibi_order"})
    assert code == 3 and "Q, K, V first" in err, err


def _kernel(tmp_path: Path, spec: dict):
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    s = load_spec_file(path)
    return lower(derive(s, str(path), seed=5, check=False).final, s.name)


DISJUNCTIONS = [  # prefix-LM and disjunctions whose parts bound the key tile from below, or not
    ("j <= i || j < W", {"W": "dynamic"}),
    ("j >= i - 5 || j >= 2 * i - 300", {}),
    ("i - j < W || j < 3", {"W": "dynamic"}),
    ("j > i + 100 || j + W >= i", {"W": 64}),
    ("j <= i || i < W", {"W": "dynamic"}),  # a part without the key: every tile where it holds, else none
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_a_disjunction_reaches_the_union_of_its_parts_tiles(tmp_path):
    """The wgmma range for masks with ||: from the least of the parts' first tiles to the greatest
    of their ends; it never skips a kept element (brute force) and skips some fully masked tiles."""
    checked, dead, skipped = _check(tmp_path, DISJUNCTIONS)
    assert 0 < skipped <= dead
    start, end = _printed_range(tmp_path, *DISJUNCTIONS[1])[:2]
    assert start.startswith("max(0LL, min("), start
    assert "max(" in _printed_range(tmp_path, *DISJUNCTIONS[0])[1]  # prefix-LM: the union's end


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
@pytest.mark.parametrize("printer,mask", [("first_tile_c", 1), ("end_tile_c", 0)])
def test_a_disjunction_range_of_one_part_is_caught(tmp_path, monkeypatch, printer, mask):
    """Read a disjunction as the conjunction of its parts (the greatest start, the least end):
    the brute force finds a kept element outside the printed range."""
    from codegen.mappings import cexpr
    from compiler.ir import Or

    real = getattr(cexpr, printer)

    def mutated(conds, var, box, names):
        return real(tuple(p for c in conds for p in (c.parts if isinstance(c, Or) else (c,))), var, box, names)

    monkeypatch.setattr(cexpr, printer, mutated)
    with pytest.raises(AssertionError, match="holds a kept element"):
        _check(tmp_path, DISJUNCTIONS[mask:mask + 1])
