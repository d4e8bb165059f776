"""The attention backward on Hopper warpgroup tensor cores (codegen.mappings.score_sum_wgmma), CPU
only: the wgmma examples (causal and not) build with their dV kernel (dK beside it) and dQ printed
on wgmma, checked by the kernel step (the text run through the emulation against float64, sizes
with tails) and compiled by NVRTC to SASS with HGMMA and no local memory; head dim 64, blocks of
two warpgroups and bf16 print and pass too; mutations of the template and of the values it prints
(the −D of dS, the −LSE of P, a transposed operand, the A fragment order, the accumulation across
tiles, the ring's wait, the proxy fence, the waits, the second warpgroup's rows, the causal skip)
fail the CPU check; what the printer does not implement is refused by name."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NONCAUSAL = ROOT / "examples" / "flash_attention_wgmma_noncausal_grad.yaml"
CAUSAL = ROOT / "examples" / "flash_attention_wgmma_grad.yaml"
TEMPLATE = "score_sum_wgmma.cu.j2"


def _fused(spec_path: Path, text: str | None = None, tmp: Path | None = None):
    """(derivation, kernel IR, check sizes) of the spec's dV kernel (which writes dK too); `text`
    replaces the spec's text (written to `tmp`)."""
    from codegen.kir.lower import lower
    from compiler.derive_grad import derive_gradient
    from compiler.spec import load_spec_file

    if text is not None:
        spec_path = tmp / spec_path.name
        spec_path.write_text(text)
    spec = load_spec_file(spec_path)
    g = derive_gradient(spec, str(spec_path), seed=1, check=False)
    kd = next(k for k in g.kernels if k.grad_kernel == "dV")
    fixed = {n: v for n, v in spec.sizes.items() if isinstance(v, int)}
    return kd, lower(kd.final, "dV"), {**spec.check_sizes, **fixed}


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
    assert "expf(" not in src and src.count(" = fast_exp2(") == 1 and "const float cs0 = fast_exp2(" in src
    assert all("cs0" in line for line in src.splitlines() if "pv[0][h] =" in line or "pv[1][h] =" in line)


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
    # every query tile overwrites the accumulators instead of adding to them
    "accumulators_reset_per_tile": ("(live || kk > 0) ? 1 : 0", "kk > 0 ? 1 : 0"),
    # the ring waits for one copy group too few: the tile is read before it lands
    "ring_wait_one_short": ("cp_async_wait<{{ stages - 2 }}>();", "cp_async_wait<{{ stages - 1 }}>();"),
    # the second k-panel of the head dim read from the first
    "score_second_panel_missed": ("(kd >> 2) * {{ BN * 8 }}", "0"),
    # the copies not made visible to the async proxy before the tensor cores read them
    "no_proxy_fence": ("        fence_proxy_async();  // the copies, visible to the tensor cores' (async proxy) reads\n"
                       "        __syncthreads();      // ...", "        __syncthreads();      // ..."),
    # the score tiles read before their wgmma group completes
    "score_read_before_wait": ("        wg_commit();\n        wg_wait<0>();\n", "        wg_commit();\n"),
    # the accumulations never waited for
    "accumulation_never_waited": ("        live = 1;\n        wg_wait<0>();", "        live = 1;"),
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
    old = "if ({{ unit_empty }}) continue;"
    assert text.count(old) == 1
    assert _check(kd, k, sizes, _render_with_template(k, text, monkeypatch))["passed"]
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, _render_with_template(k, text.replace(old, "if (!({{ unit_empty }})) continue;"), monkeypatch))


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


def test_refuses_group_loops(fused):
    from codegen.kir.ir import State, TileLoop
    from compiler.ir import Bin, Const, Read
    from compiler.ir_index import Ext

    _, k, _ = fused
    loop = k.body[-1]
    tot = tuple(State(f"tot{i}", Const(0.0), Bin("+", Read(f"tot{i}", ()), Read(st.name, ())))
                for i, st in enumerate(loop.state))
    _refused(replace(k, body=k.body[:-1] + (TileLoop("g", Ext.of(2), tot, (loop,)),)), "group loops")


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
