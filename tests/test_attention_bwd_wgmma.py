"""The attention backward on Hopper warpgroup tensor cores (codegen.mappings.score_sum_wgmma), CPU
only: the wgmma examples (causal and not) build with their dV kernel (dK beside it) and dQ printed
on wgmma, checked by the kernel step (the text run through the emulation against float64, sizes
with tails) and compiled by NVRTC to SASS with HGMMA and no local memory; head dim 64, blocks of
two warpgroups and bf16 print and pass too; mutations of the template and of the values it prints
(the −D of dS, the −LSE of P, a transposed operand, the A fragment order, the accumulation across
tiles, the ring's wait, the proxy fence, the waits, the second warpgroup's rows, the causal skip)
fail the CPU check; what the printer does not implement is refused by name.  Every variant example's
backward (sliding window, ALiBi, strict causal, GQA's group loops, [B, N, H, D], bottom-right causal,
prefix-LM, bias) prints on wgmma and matches its program at sizes with tails; a mutation per
feature (the window's bound and range, the ALiBi term, the bias read, the group loop and its
accumulators, the [B, N, H, D] row stride) fails the CPU check."""
from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NONCAUSAL = ROOT / "examples" / "flash_attention_wgmma_noncausal_grad.yaml"
CAUSAL = ROOT / "examples" / "flash_attention_wgmma_grad.yaml"
TEMPLATE = "score_sum_wgmma.cu.j2"


def _fused(spec_path: Path, text: str | None = None, tmp: Path | None = None, kernel: str = "dV"):
    """(derivation, kernel IR, check sizes) of the spec's dV kernel (which writes dK too), or of
    `kernel`; `text` replaces the spec's text (written to `tmp`)."""
    from codegen.kir.lower import lower
    from compiler.derive_grad import derive_gradient
    from compiler.spec import load_spec_file

    if text is not None:
        spec_path = tmp / spec_path.name
        spec_path.write_text(text)
    spec = load_spec_file(spec_path)
    g = derive_gradient(spec, str(spec_path), seed=1, check=False)
    kd = next(k for k in g.kernels if k.grad_kernel == kernel)
    fixed = {n: v for n, v in spec.sizes.items() if isinstance(v, int)}
    return kd, lower(kd.final, kernel), {**spec.check_sizes, **fixed}


def dv_schedule_variant(text: str, old: str, new: str) -> str:
    """A spec's text with `old` replaced by `new` in its dV kernel's schedule only."""
    head, rest = text.split("    - output: dV\n", 1)
    dv, dq = rest.split("    - output: dQ\n", 1)
    assert old in dv
    return head + "    - output: dV\n" + dv.replace(old, new) + "    - output: dQ\n" + dq


def two_warpgroups(text: str) -> str:
    """A wgmma example's text with its dV / dK kernel on blocks of 128 key rows, 64 per warpgroup."""
    text = dv_schedule_variant(text, "index: ji, to: warp, count: 4", "index: ji, to: warp, count: 8")
    for d in ("dV", "dK"):
        text = dv_schedule_variant(text, f"- {{rule: tile, def: {d}, index: j, size: 64}}",
                                   f"- {{rule: tile, def: {d}, index: j, size: 128}}")
    return text


def three_stages(text: str) -> str:
    """A wgmma example's text with its backward kernels' rings of three stages (the printer then keeps
    each tile's last accumulation in flight across the next tile's barrier and score wgmmas)."""
    assert text.count("level: shared, stages: 2}") == 4
    return text.replace("level: shared, stages: 2}", "level: shared, stages: 3}")


def wide_dq(text: str) -> str:
    """A wgmma example's text with its dQ kernel on key tiles of 128 (m64n128 score wgmmas)."""
    old = "- {rule: tile, def: dQ, index: j, size: 64}"
    assert text.count(old) == 1
    return text.replace(old, "- {rule: tile, def: dQ, index: j, size: 128}")


def head_dim(text: str, d: int) -> str:
    assert "D: 128}" in text
    return text.replace("D: 128}", f"D: {d}}}")


@pytest.fixture(scope="module")
def fused():
    return _fused(NONCAUSAL)


def _check(kd, k, sizes, printed=None) -> dict:
    from codegen.build import largest_tiles, print_checked
    from codegen.kernel_check import check_kernel_text

    printed = printed or print_checked(k)
    return check_kernel_text(printed, kd.final, sizes, 7, largest_tiles(kd))


def _sass(printed) -> tuple[object, str]:
    from codegen.cuda.nvrtc import compile_cubin
    from codegen.cuda.sass import check_promises, disassemble

    ks = printed.variants[0].source
    comp = compile_cubin(ks.source, ks.entry, tuple(ks.options) + ("-Xptxas=-v",))
    report = disassemble(comp.cubin, ptxas_log=comp.log)
    assert check_promises(report, **printed.promises) == []
    return report, comp.log


# -- the examples' builds -------------------------------------------------------------------------

@pytest.mark.parametrize("example", [NONCAUSAL, CAUSAL], ids=["noncausal", "causal"])
def test_the_example_builds_its_backward_on_wgmma(example_build, example):
    b = example_build(example)
    assert b.rc == 0, b.stderr[-2000:]
    manifest = json.loads((b.out / "grad.json").read_text())
    writes = {k["name"]: [k["output"], *(a["name"] for a in k.get("also", []))] for k in manifest["kernels"]}
    assert writes["dV"] == ["dV", "dK"]
    for name, sums in (("dV", 2), ("dQ", 1)):
        d = b.out / "grad" / name
        plan = json.loads((d / "plan.json").read_text())
        assert plan["mapping"] == "score_sum_wgmma", name
        assert plan["plan"]["mma"] == "wgmma" and len(plan["plan"]["scores"]) == 2, name
        assert len(plan["plan"]["acc_tiles"]) == sums, name
        sass = json.loads((d / "sass.json").read_text())
        assert sass["hgmma"] and not sass["hmma"] and sass["ldgsts"], (name, sass)
        assert sass["violations"] == [] and sass["local_memory_ops"] == 0, (name, sass)
        log = (d / "compile.log").read_text()
        assert "0 bytes spill stores" in log and "C75" not in log, log  # no serialized wgmma pipeline
        steps = json.loads((d / "derivation.json").read_text())["steps"]
        kernel = next(s for s in steps if s["rule"] == "kernel")
        draws = kernel["numeric"]["draws"]
        assert draws and all(x["passed"] for x in draws), name
        # the draws reach several tiles with a tail (tiles of 64): the ring, the range and the tail
        assert any(x["sizes"]["N"] > 128 and x["sizes"]["N"] % 64 for x in draws), name
        src = (d / "kernel.cu").read_text()
        assert "asm" not in src.split("end of instruction wrappers")[1], "inline PTX outside the wrapper layer"


def test_the_products_read_the_score_accumulators_as_register_operands(fused):
    """Sᵀ = K Qᵀ and dPᵀ = V dOᵀ once each (both operands in shared memory), then dV += Pᵀ dO and
    dK += dSᵀ Q with Pᵀ / dSᵀ packed from the score accumulators into register A operands; what the
    two values share is computed once."""
    from codegen.build import print_checked

    _, k, _ = fused
    printed = print_checked(k)
    assert printed.mapping == "score_sum_wgmma"
    p = printed.plan
    assert [p.col_tiles[t].op.name for t in p.acc_tiles] == ["dO", "Q"] and [o.name for o in p.outs] == ["dV", "dK"]
    src = printed.variants[0].source.source
    assert src.count("wgmma_acc(acc0, pa0[kk]") == 1 and src.count("wgmma_acc(acc1, pa1[kk]") == 1
    assert src.count("wgmma_score(sc0,") == 1 and src.count("wgmma_score(sc1,") == 1
    # P = exp(S - LSE), in dV's value and inside dK's dS, is computed once per element and read by both
    assert "expf(" not in src and src.count(" = fast_exp2(") == 1 and "cs0[kk][j][h] = fast_exp2(" in src
    assert all("cs0" in line for line in src.splitlines() if "pv[0][h] =" in line)
    # one wgmma group per score; P and dV's accumulation issued once S has landed, while dP's wgmma
    # runs; dK's once dP has landed, while dV's accumulation runs
    body = src.split("one wgmma group per score tile")[1]
    assert [line.strip() for line in body.splitlines() if "wg_wait<" in line or "wg_commit()" in line
            or "wgmma_acc(acc" in line] == [
        "wg_commit();", "wg_commit();", "wg_wait<1>();  // score tile(s) 0 landed",
        "wgmma_acc(acc0, pa0[kk], dX + (unsigned long long)(kk * 128), (live || kk > 0) ? 1 : 0);", "wg_commit();",
        "wg_wait<1>();  // score tile(s) 1 landed",
        "wgmma_acc(acc1, pa1[kk], dX + (unsigned long long)(kk * 128), (live || kk > 0) ? 1 : 0);", "wg_commit();",
        "wg_wait<0>();  // the accumulations", "wg_wait<0>();  // the last accumulations"]


def test_dq_loads_its_row_terms_once_and_forms_p_while_dp_runs(monkeypatch):
    """dQ: LSE and Dsum are per query row, the same at every key tile: loaded once before the loop;
    P = exp(S - LSE) is formed once S has landed, while dP's wgmma runs.  Reading the rows of the
    fragment's first half for both halves shows in the numbers."""
    from codegen.build import print_checked
    from codegen.kernel_check import KernelCheckError
    from codegen.mappings.templates_env import TEMPLATE_DIR

    kd, k, sizes = _fused(CAUSAL, kernel="dQ")
    printed = print_checked(k)
    src = printed.variants[0].source.source
    head, loop = src.split("for (int it = it_begin; it < it_end; ++it)")
    assert head.count("p_LSE[") == 1 and head.count("p_Dsum[") == 1
    assert "p_LSE[" not in loop and "p_Dsum[" not in loop
    assert (loop.index("wg_wait<1>();  // score tile(s) 0 landed") < loop.index("cs0[kk][j][h] = ") < loop.index("fast_exp2(")
            < loop.index("wg_wait<0>();  // score tile(s) 1 landed"))
    assert _check(kd, k, sizes, printed)["passed"]
    text = (TEMPLATE_DIR / TEMPLATE).read_text()
    old = "const int er_ = wgi * 64 + wq * 16 + g + 8 * h;"
    assert text.count(old) == 1
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, _render_with_template(k, text.replace(old, "const int er_ = wgi * 64 + wq * 16 + g;"),
                                                    monkeypatch))


# -- three stages: the last accumulation of a tile in flight across the next tile's barrier --------

@pytest.fixture(scope="module")
def fused_three_stages(tmp_path_factory):
    return _fused(CAUSAL, three_stages(CAUSAL.read_text()), tmp_path_factory.mktemp("s3"))


def test_three_stages_keep_the_last_accumulation_in_flight(fused_three_stages):
    from codegen.build import print_checked
    from codegen.cuda import nvrtc, sass

    kd, k, sizes = fused_three_stages
    printed = print_checked(k)
    assert printed.plan.stages == 3
    src = printed.variants[0].source.source
    loop = src.split("for (int it = it_begin; it < it_end; ++it)")[1]
    # the ring refills the slot of step s - 2 (one step ahead), the tile ends waiting for dV's only
    assert "if (it + 1 < it_end)" in loop and "(s + 1) % 3" in loop
    assert "wg_wait<1>();  // the accumulations but the last" in loop
    assert _check(kd, k, sizes, printed)["passed"]
    if nvrtc.nvrtc_available() and sass.sass_available():
        report, log = _sass(printed)
        assert report.local_memory_ops == 0 and "C75" not in log


THREE_STAGE_MUTATIONS = {
    # the ring refilled two steps ahead: the slot the last accumulation still reads is overwritten
    "ring_refills_the_slot_in_flight": ("lead=p.stages - 2 if p.stages >= 3", "lead=p.stages - 1 if p.stages >= 3"),
}


@pytest.mark.parametrize("name", sorted(THREE_STAGE_MUTATIONS))
def test_a_mutated_three_stage_ring_fails_the_cpu_check(fused_three_stages, monkeypatch, name):
    import inspect

    from codegen.kernel_check import KernelCheckError
    from codegen.mappings import score_sum_wgmma

    kd, k, sizes = fused_three_stages
    old, new = THREE_STAGE_MUTATIONS[name]
    src = inspect.getsource(score_sum_wgmma.context)
    assert src.count(old) == 1, f"{name}: the site moved"
    ns: dict = {}
    exec(compile(src.replace(old, new), score_sum_wgmma.__file__, "exec"), score_sum_wgmma.__dict__, ns)
    monkeypatch.setattr(score_sum_wgmma, "context", ns["context"])
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, score_sum_wgmma.render(k))


def test_dq_on_key_tiles_of_128_prints_and_matches_its_program(tmp_path):
    from codegen.build import print_checked
    from codegen.cuda import nvrtc, sass

    kd, k, sizes = _fused(CAUSAL, wide_dq(CAUSAL.read_text()), tmp_path, kernel="dQ")
    printed = print_checked(k)
    assert printed.mapping == "score_sum_wgmma" and printed.plan.block_n == 128
    assert "wgmma_score(sc0," in printed.variants[0].source.source
    assert _check(kd, k, sizes, printed)["passed"]
    if nvrtc.nvrtc_available() and sass.sass_available():
        report, log = _sass(printed)
        assert report.has_hgmma and report.local_memory_ops == 0 and "C75" not in log


# -- other shapes: head dim 64, two warpgroups ----------------------------------------------------

@pytest.fixture(scope="module")
def fused_two_warpgroups(tmp_path_factory):
    return _fused(NONCAUSAL, two_warpgroups(NONCAUSAL.read_text()), tmp_path_factory.mktemp("wg2"))


@pytest.fixture(scope="module")
def fused_head64(tmp_path_factory):
    return _fused(NONCAUSAL, head_dim(NONCAUSAL.read_text(), 64), tmp_path_factory.mktemp("d64"))


@pytest.fixture(scope="module")
def fused_bf16(tmp_path_factory):
    return _fused(NONCAUSAL, NONCAUSAL.read_text().replace("dtype: f16", "dtype: bf16"), tmp_path_factory.mktemp("bf16"))


@pytest.mark.parametrize("shape", ["fused_head64", "fused_two_warpgroups", "fused_bf16"])
def test_other_shapes_print_and_match_their_program(request, shape):
    from codegen.build import print_checked
    from codegen.cuda import nvrtc, sass

    kd, k, sizes = request.getfixturevalue(shape)
    printed = print_checked(k)
    assert printed.mapping == "score_sum_wgmma"
    assert printed.plan.dtype == ("bf16" if shape == "fused_bf16" else "f16")
    assert printed.variants[0].launch.threads == (256 if shape == "fused_two_warpgroups" else 128)
    assert _check(kd, k, sizes, printed)["passed"]
    if nvrtc.nvrtc_available() and sass.sass_available():
        report, _ = _sass(printed)
        assert report.has_hgmma and report.local_memory_ops == 0


# -- mutations: each must fail the CPU check -----------------------------------------------------

TEMPLATE_MUTATIONS = {
    # the accumulation's B (dO, Q: [query][d] = [k][n]) read K-major: the tile transposed
    "accumulation_b_transposed": ("{{ instr.wgmma_rs('wgmma_acc', D, dt, True) }}",
                                  "{{ instr.wgmma_rs('wgmma_acc', D, dt, False) }}"),
    # the score's B (Q, dO: [query][e] = [n][k]) read MN-major
    "score_b_transposed": ("{{ instr.wgmma_ss('wgmma_score', BN, dt, False) }}",
                           "{{ instr.wgmma_ss('wgmma_score', BN, dt, True) }}"),
    # the A fragment's registers 1 and 2 swapped (rows g + 8 and columns 8.. exchanged)
    "a_fragment_order": ("const int e = 2 * (j & 1) + h;", "const int e = (j & 1) + 2 * h;"),
    # the column reads (dV / dK: LSE, Dsum per query) loaded at the fragment's other column
    "column_read_misplaced": ("const int ec_ = nt * 8 + 2 * qd + h;", "const int ec_ = nt * 8 + 2 * qd + 1 - h;"),
    # every query tile overwrites the accumulators instead of adding to them
    "accumulators_reset_per_tile": ("(live || kk > 0) ? 1 : 0", "kk > 0 ? 1 : 0"),
    # the ring waits for one copy group too few: the tile is read before it lands
    "ring_wait_one_short": ("cp_async_wait<{{ lead - 1 }}>();", "cp_async_wait<{{ lead }}>();"),
    # the second k-panel of the head dim read from the first
    "score_second_panel_missed": ("(kd >> 2) * {{ BN * 8 }}", "0"),
    # the copies not made visible to the async proxy before the tensor cores read them
    "no_proxy_fence": ("        fence_proxy_async();  // the copies, visible to the tensor cores' (async proxy) reads\n"
                       "        __syncthreads();      // ...", "        __syncthreads();      // ..."),
    # the score tiles read before their wgmma groups complete (no phase waits)
    "score_read_before_wait": ("        wg_wait<{{ ph.wait }}>();", ""),
    # every phase waits for one group too few: S read while its wgmma is in flight
    "phase_wait_one_short": ("wg_wait<{{ ph.wait }}>();", "wg_wait<{{ ph.wait + 1 }}>();"),
    # the later phases wait for one group too few: dK's dS reads dP while its wgmma is in flight (dV's
    # accumulation, issued after dP's score, counted as if it were before)
    "later_phase_wait_one_short": ("wg_wait<{{ ph.wait }}>();", "wg_wait<{{ ph.wait + (0 if loop.first else 1) }}>();"),
    # the scores in one wgmma group, each phase's wait counting groups as if there were one per score
    "scores_in_one_group": ("        }\n        wg_commit();\n{%- endfor %}", "        }\n{%- endfor %}\n        wg_commit();"),
    # the accumulations never waited for at the end of a tile
    "accumulation_never_waited": ("wg_wait<{{ 1 if kept else 0 }}>();", ""),
}


def _render_with_template(k, text: str, monkeypatch):
    import jinja2

    from codegen.mappings import templates_env
    from codegen.mappings.score_sum_wgmma import render

    env = templates_env._env
    loader = jinja2.ChoiceLoader([jinja2.DictLoader({TEMPLATE: text}), env.loader])
    monkeypatch.setattr(templates_env, "_env", env.overlay(loader=loader))
    return render(k)


@pytest.mark.parametrize("name", sorted(TEMPLATE_MUTATIONS))
def test_a_mutated_template_fails_the_cpu_check(fused, monkeypatch, name):
    from codegen.kernel_check import KernelCheckError
    from codegen.mappings.templates_env import TEMPLATE_DIR

    kd, k, sizes = fused
    old, new = TEMPLATE_MUTATIONS[name]
    text = (TEMPLATE_DIR / TEMPLATE).read_text()
    assert text.count(old) >= 1, f"{name}: the site moved"
    printed = _render_with_template(k, text.replace(old, new), monkeypatch)
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, printed)


def test_the_second_warpgroup_reading_the_first_ones_rows_fails_the_cpu_check(fused_two_warpgroups, monkeypatch):
    from codegen.kernel_check import KernelCheckError
    from codegen.mappings.templates_env import TEMPLATE_DIR

    kd, k, sizes = fused_two_warpgroups
    text = (TEMPLATE_DIR / TEMPLATE).read_text()
    old = "(unsigned)wgi * {{ 64 * 128 }}u"
    assert text.count(old) == 1
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, _render_with_template(k, text.replace(old, "0u"), monkeypatch))


def test_the_causal_skip_inverted_fails_the_cpu_check(monkeypatch):
    """Causal: the tile range starts at the diagonal and a warpgroup skips the tiles its rows see
    nothing of; skipping the others instead shows in the numbers."""
    from codegen.kernel_check import KernelCheckError
    from codegen.mappings.templates_env import TEMPLATE_DIR

    kd, k, sizes = _fused(CAUSAL)
    text = (TEMPLATE_DIR / TEMPLATE).read_text()
    old = "if ({{ unit_empty }}) {"
    assert text.count(old) == 1
    assert _check(kd, k, sizes, _render_with_template(k, text, monkeypatch))["passed"]
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, _render_with_template(k, text.replace(old, "if (!({{ unit_empty }})) {"), monkeypatch))


def _value_patch(monkeypatch, change) -> None:
    """The sums' element values printed through `change(value)` (score_sum.element_value_c)."""
    from codegen.mappings import score_sum

    orig = score_sum.element_value_c
    monkeypatch.setattr(score_sum, "element_value_c",
                        lambda k, v, names, score_of, **kw: orig(k, change(v), names, score_of, **kw))


@pytest.mark.parametrize("tensor", ["Dsum", "LSE"], ids=["dS_without_D", "P_without_LSE"])
def test_a_value_without_its_row_term_fails_the_cpu_check(fused, monkeypatch, tensor):
    from codegen.kernel_check import KernelCheckError
    from codegen.mappings.score_sum_wgmma import render
    from compiler.ir import Const, replace_reads

    kd, k, sizes = fused
    _value_patch(monkeypatch, lambda v: replace_reads(v, tensor, lambda r: Const(0.0)))
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, render(k))


# -- refusals by name ------------------------------------------------------------------------------

def _refused(k, *fragments) -> None:
    from codegen.kir.lower import UnsupportedMapping
    from codegen.mappings.score_sum_wgmma import render

    with pytest.raises(UnsupportedMapping) as exc:
        render(k)
    assert "score_sum wgmma mapping" in str(exc.value), str(exc.value)
    for f in fragments:
        assert f in str(exc.value), str(exc.value)


def test_refuses_a_head_dim_it_does_not_implement(tmp_path):
    _, k, _ = _fused(NONCAUSAL, head_dim(NONCAUSAL.read_text(), 96), tmp_path)
    _refused(k, "head dim 96")


def test_refuses_rows_that_are_not_whole_warpgroups(fused):
    _, k, _ = fused
    rows = k.lanes[0]
    eight = replace(rows, mapping=replace(rows.mapping, count=8))  # 64 rows over 8 warps: 8 rows a warp
    _refused(replace(k, lanes=(eight,) + k.lanes[1:]), "whole warpgroups")


def test_gqa_fused_kernel_is_a_group_loop_around_one_tile_loop_of_two_sums():
    """GQA's dV kernel writes dK too: FUSE-SUMS (inner: io) leaves one query-tile loop carrying both
    sums inside the group loop over g, and the plan reads two sums under one group loop."""
    from codegen.build import print_checked
    from codegen.kir.ir import TileLoop

    _, k, _ = _variant("attention_gqa_grad")["dV"]
    group = k.body[-1]
    assert isinstance(group, TileLoop) and group.var == "g" and len(group.state) == 2
    (inner,) = group.body
    assert isinstance(inner, TileLoop) and inner.var == "io" and len(inner.state) == 2
    printed = print_checked(k)
    plan = printed.plan
    assert plan.groups == ("g",) and [o.name for o in plan.outs] == ["dV", "dK"]
    assert [plan.col_tiles[t].op.name for t in plan.acc_tiles] == ["dO", "Q"]
    # the tile range does not read g: computed once, before the group loop (no spills on sm_90a)
    src = printed.variants[0].source.source
    assert src.index("const int it_begin") < src.index("for (int bi_g = 0;") < src.index("const f16_t* gC0")


def test_refuses_a_kernel_mapped_to_mma_sync():
    _, k, _ = _fused(ROOT / "examples" / "flash_attention_grad_mma_d128.yaml")
    _refused(k, "mapped to mma_sync")


def test_exp_without_its_log2e_factor_fails_the_cpu_check(fused, monkeypatch):
    """exp(x) is printed as ex2.approx(log2(e) x): 2^x instead shows in the numbers."""
    from codegen.kernel_check import KernelCheckError
    from codegen.mappings import score_sum
    from codegen.mappings.score_sum_wgmma import render

    kd, k, sizes = fused
    monkeypatch.setattr(score_sum, "LOG2E", 1.0)
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, render(k))


# -- the variant examples: every attention backward on wgmma ---------------------------------------

# example -> (its backward kernels, sizes with tails: a tile and a bit, several tiles and a bit, and
# for each example the extra sizes its mask or layout needs to cut: a window shorter than a tile and
# one longer, a prefix inside N and beyond it, NQ above and below NK, two heads for [B, N, H, D])
VARIANTS = {
    "attention_sliding_window_grad": (("dV", "dQ"), ({"N": 77, "W": 16}, {"N": 129, "W": 100})),
    "attention_alibi_grad": (("dV", "dQ"), ({"N": 17}, {"N": 129})),
    "attention_strict_causal_grad": (("dV", "dQ"), ({"N": 17}, {"N": 129})),
    "attention_gqa_grad": (("dV", "dQ"), ({"G": 3, "N": 77}, {"G": 2, "N": 129}, {"G": 1, "N": 65})),
    "flash_attention_wgmma_bnhd_grad": (("dV", "dQ"), ({"H": 2, "N": 77}, {"H": 3, "N": 129})),
    "attention_bottom_right_causal_grad": (("dV", "dQ"), ({"NQ": 77, "NK": 129}, {"NQ": 129, "NK": 77})),
    "attention_prefix_lm_grad": (("dV", "dQ"), ({"N": 77, "Prefix": 200}, {"N": 129, "Prefix": 50})),
    "attention_bias_grad": (("dV", "dQ"), ({"N": 17}, {"N": 129})),
}


@functools.lru_cache(maxsize=None)
def _variant(example: str) -> dict:
    """{kernel: (its derivation, its kernel IR, the spec's check sizes)} of a variant example's backward."""
    from codegen.kir.lower import lower
    from compiler.derive_grad import derive_gradient
    from compiler.spec import load_spec_file

    path = ROOT / "examples" / f"{example}.yaml"
    spec = load_spec_file(path)
    g = derive_gradient(spec, str(path), seed=1, check=False)
    fixed = {n: v for n, v in spec.sizes.items() if isinstance(v, int)}
    return {kd.grad_kernel: (kd, lower(kd.final, kd.grad_kernel), {**spec.check_sizes, **fixed}) for kd in g.kernels}


@pytest.mark.parametrize("example", sorted(VARIANTS))
def test_every_variant_backward_prints_on_wgmma_and_matches_its_program_at_tails(example):
    """Each variant's dV (with dK beside it; GQA: both summed over the query heads in one kernel) and dQ
    map to score_sum wgmma and the kernel text, run on the CPU, matches float64 at sizes with tails."""
    from codegen.build import print_checked

    kernels, sizes = VARIANTS[example]
    derived = _variant(example)
    # Dsum: a SIMT row reduction; the bias example's dBias: score_store (mma.sync)
    assert sorted(k for k in derived if k not in ("Dsum", "dBias")) == sorted(kernels)
    for name in kernels:
        kd, k, base = derived[name]
        printed = print_checked(k)
        assert printed.mapping == "score_sum_wgmma", (example, name)
        assert printed.plan.groups == (("g",) if example == "attention_gqa_grad" and name != "dQ" else ()), name
        if name == "dV":
            assert [o.name for o in printed.plan.outs] == ["dV", "dK"]
        for at in sizes:
            assert _check(kd, k, {**base, **at}, printed)["passed"], (example, name, at)


def test_the_sliding_window_narrows_both_ends_of_every_tile_range():
    """j <= i && i - j < W: dV / dK's query tiles start at the diagonal and end where the window stops;
    dQ's key tiles start where the window reaches and end at the diagonal."""
    from codegen.build import print_checked

    derived = _variant("attention_sliding_window_grad")
    for name in ("dV", "dQ"):
        src = print_checked(derived[name][1]).variants[0].source.source
        begin, end = (next(x for x in src.splitlines() if f"const int {b} =" in x) for b in ("it_begin", "it_end"))
        assert ("sz_W" in end) == (name == "dV") and ("sz_W" in begin) == (name == "dQ"), (name, begin, end)
        assert "rt" in begin and "rt" in end, name


def _without_conjuncts(v, size: str):
    """v with every guard conjunct that reads `size` dropped."""
    from compiler.ir import Select, map_children

    if isinstance(v, Select):
        conds = tuple(c for c in v.conds if size not in c.names())
        then, other = _without_conjuncts(v.then, size), _without_conjuncts(v.other, size)
        return Select(conds, then, other) if conds else then
    return map_children(v, lambda x: _without_conjuncts(x, size))


def _variant_fails(example: str, kernel: str, sizes: dict, render) -> None:
    from codegen.kernel_check import KernelCheckError

    kd, k, base = _variant(example)[kernel]
    with pytest.raises(KernelCheckError):
        _check(kd, k, {**base, **sizes}, render(k))


VALUE_MUTATIONS = {
    # the window's bound i - j < W dropped from the printed mask: keys past the window leak in
    "window_bound_dropped": ("attention_sliding_window_grad", "dV", {"N": 129, "W": 16},
                             lambda v: _without_conjuncts(v, "W")),
    # the ALiBi slope term Slope[h] * (j - i) dropped from the recomputed score
    "alibi_term_dropped": ("attention_alibi_grad", "dQ", {"N": 77}, "Slope"),
    # the bias read dropped from the recomputed score
    "bias_read_dropped": ("attention_bias_grad", "dV", {"N": 77}, "Bias"),
}


@pytest.mark.parametrize("name", sorted(VALUE_MUTATIONS))
def test_a_variant_value_mutated_fails_the_cpu_check(monkeypatch, name):
    from codegen.mappings.score_sum_wgmma import render
    from compiler.ir import Const, replace_reads

    example, kernel, sizes, change = VALUE_MUTATIONS[name]
    if isinstance(change, str):
        tensor = change
        change = lambda v: replace_reads(v, tensor, lambda r: Const(0.0))  # noqa: E731
    _value_patch(monkeypatch, change)
    _variant_fails(example, kernel, sizes, render)


def _context_mutant(monkeypatch, module, function: str, old: str, new: str) -> None:
    """`module.function` recompiled with `old` replaced by `new` (once)."""
    import inspect

    src = inspect.getsource(getattr(module, function))
    assert src.count(old) == 1, f"{function}: the site moved"
    ns: dict = {}
    exec(compile(src.replace(old, new), module.__file__, "exec"), module.__dict__, ns)
    monkeypatch.setattr(module, function, ns[function])
    from codegen.mappings import score_sum_wgmma

    if getattr(score_sum_wgmma, function, None) is not None:  # imported by name there
        monkeypatch.setattr(score_sum_wgmma, function, ns[function])


PLAN_MUTATIONS = {
    # the window's end of dV / dK's query-tile range one tile short: the last tiles the window reaches are lost
    "window_range_ends_a_tile_early": ("attention_sliding_window_grad", "dV", {"N": 129, "W": 100},
                                       "shared_context", "end = f\"min({end}, {upper})\"",
                                       "end = f\"min({end}, {upper} - 1)\""),
    # GQA: the group loop stops one query head short
    "group_loop_drops_the_last_head": ("attention_gqa_grad", "dV", {"G": 3, "N": 77}, "shared_context",
                                       'ext=f"(long long)({ext_c(g.ext, {**blk, **group})})"',
                                       'ext=f"((long long)({ext_c(g.ext, {**blk, **group})}) - 1)"'),
    # [B, N, H, D]: the tiles' rows read D apart, as in [B, H, N, D], instead of H * D
    "bnhd_rows_read_d_apart": ("flash_attention_wgmma_bnhd_grad", "dV", {"H": 2, "N": 77}, "shared_context",
                               "row_lds=[stride_c(t.op, t.op.roles.index(\"seq\"), fixed) for t in p.row_tiles]",
                               "row_lds=[str(p.head) for t in p.row_tiles]"),
}


@pytest.mark.parametrize("name", sorted(PLAN_MUTATIONS))
def test_a_variant_plan_mutated_fails_the_cpu_check(monkeypatch, name):
    from codegen.mappings import score_sum
    from codegen.mappings.score_sum_wgmma import render

    example, kernel, sizes, function, old, new = PLAN_MUTATIONS[name]
    _context_mutant(monkeypatch, score_sum, function, old, new)
    _variant_fails(example, kernel, sizes, render)


@pytest.mark.parametrize("restart", ["\n    live = 0;", "\n    for (int i_ = 0; i_ < {{ AN }}; ++i_) acc1[i_] = 0.0f;"],
                         ids=["both_sums", "dK_only"])
def test_a_group_step_restarting_the_accumulators_fails_the_cpu_check(monkeypatch, restart):
    """GQA's fused dV / dK: each query head's step adds into both accumulators what the earlier steps
    left; a step that starts them anew (the first accumulation's scale-d 0), or starts the second
    sum's (dK's) anew, keeps only the last head's sum."""
    from codegen.mappings.templates_env import TEMPLATE_DIR

    text = (TEMPLATE_DIR / TEMPLATE).read_text()
    old = "    __syncthreads();  // every warpgroup is done with the column ring of the previous group step"
    assert text.count(old) == 1
    kd, k, base = _variant("attention_gqa_grad")["dV"]
    sizes = {**base, "G": 3, "N": 77}
    assert _check(kd, k, sizes, _render_with_template(k, text, monkeypatch))["passed"]
    _variant_fails("attention_gqa_grad", "dV", {"G": 3, "N": 77},
                   lambda k: _render_with_template(k, text.replace(old, old + restart), monkeypatch))


def test_gqa_dq_with_the_wrong_head_map_fails_the_cpu_check(monkeypatch):
    """GQA's dQ: hk and g share grid.y (blockIdx.y = hk * G + g); recovering hk as blockIdx.y mod G
    instead of blockIdx.y / G reads another K / V head, which the kernel text's CPU run shows."""
    from codegen.mappings import score_sum
    from codegen.mappings.score_sum_wgmma import render

    orig = score_sum.block_index_c
    kd, k, base = _variant("attention_gqa_grad")["dQ"]
    sizes = {"HK": 2, "G": 3, "N": 77}
    assert _check(kd, k, {**base, **sizes}, render(k))["passed"]
    monkeypatch.setattr(score_sum, "block_index_c",
                        lambda dims: {v: x.replace(" / (", " % (") for v, x in orig(dims).items()})
    _variant_fails("attention_gqa_grad", "dQ", sizes, render)


def test_the_lowering_refuses_fold_updates_whose_tile_sums_are_staged_differently(monkeypatch):
    """One tile loop carries the fold's updates' sums only when each stages the same tiles: GQA's dK
    sum staging dO in a ring of another depth is refused by name (and, with that check dropped, the
    lowering would run dK's sum on dV's ring)."""
    from codegen.kir import lower as lowering
    from compiler.ir import Fold, Let, walk

    kd, _, _ = _variant("attention_gqa_grad")["dV"]
    d = kd.final.def_named("dV")
    fold = next(x for x in walk(d.body) if isinstance(x, Fold))
    u = fold.update[1]
    let = u.b.body
    assert isinstance(let, Let)
    deeper = replace(u, b=replace(u.b, body=replace(let, bind=replace(let.bind, stages=3))))

    def swap(e):
        return replace(e, update=(e.update[0], deeper)) if e is fold else map_children(e, swap)

    from compiler.ir import map_children

    prog = kd.final.with_def(replace(d, body=swap(d.body)))
    with pytest.raises(lowering.LoweringError, match="stages a tile inside an expression"):
        lowering.lower(prog, "dV")
    monkeypatch.setattr(lowering, "_same_steps", lambda loop, others: True)
    lowering.lower(prog, "dV")  # the mutant accepts it
