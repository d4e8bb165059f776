"""Attention layouts and grouped-query attention on the tensor-core fold mappings (issue 11).

- the new examples ([B, N, H, D] and GQA) build to wgmma kernels through NVRTC and SASS;
- generated index maps: every operand of a derived kernel IR is permuted at random (its
  tensor's dims, its reads and the store permuted alike, so the program is the same computation
  over another memory layout); the mapping either prints addresses that match numpy's strides
  of that layout (batch offsets, row strides, TMA views and coordinates) or refuses by name;
- shared grid axes: the printed block indices enumerate the product of the loops, row-major,
  exactly once; the runtime sizes the axis as the product and checks its limit;
- mutations of the stride and block-index printers are caught by the same checks.
"""
from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import codegen.mappings.ctx_common as ctx_common
from codegen.mappings.ctx_common import Sizes, attn_addressing, with_roles
from codegen.kir.grid import axis_blocks, block_index_c
from codegen.kir.ir import Kernel, Stage, TensorArg, TileLoop
from codegen.kir.lower import UnsupportedMapping, lower
from codegen.mappings import online_fold
from codegen.mappings.render import _attention_ctx
from codegen.mappings.render_attn_wgmma import _context as wgmma_context
from codegen.mappings.render_attn_wgmma import tma_view
from compiler.derive import derive
from compiler.ir import Read, Select
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
_KIR: dict[str, Kernel] = {}


def kernel_of(example: str, edit=None) -> Kernel:
    """The kernel IR of an example (derived once per example and edit)."""
    key = example + (edit.__name__ if edit else "")
    if key not in _KIR:
        path = ROOT / "examples" / f"{example}.yaml"
        spec = load_spec_file(path)
        _KIR[key] = lower(derive(spec, str(path), seed=1).final, spec.name)
    return _KIR[key]


# ------------------------------------------------------------------ permuting a kernel IR's layouts
def _permute_read(e, tensor: str, perm: tuple[int, ...]):
    if isinstance(e, Select):
        return replace(e, then=_permute_read(e.then, tensor, perm))
    if isinstance(e, Read) and e.tensor == tensor:
        return replace(e, idx=tuple(e.idx[p] for p in perm))
    return e


def permuted(k: Kernel, perms: dict[str, tuple[int, ...]]) -> Kernel:
    """The same computation with tensor t stored as its dims permuted by perms[t]."""
    tensors = tuple(replace(t, dims=tuple(t.dims[p] for p in perms[t.name])) if t.name in perms else t
                    for t in k.tensors)

    def stmt(s):
        if isinstance(s, Stage):
            for name, perm in perms.items():
                s = replace(s, value=_permute_read(s.value, name, perm))
            return s
        if isinstance(s, TileLoop):
            return replace(s, body=tuple(stmt(x) for x in s.body))
        return s

    store = k.store
    if store.tensor in perms:
        store = replace(store, index=tuple(store.index[p] for p in perms[store.tensor]))
    return replace(k, tensors=tensors, body=tuple(stmt(s) for s in k.body), store=store)


# ------------------------------------------------------------------ evaluating printed C in Python
def c_eval(expr: str, env: dict[str, int]) -> int:
    text = expr.replace("(long long)", "").replace("(int)", "").replace("1u", "1").replace("/", "//")
    text = re.sub(r"blockIdx\.([xyz])", r"blk_\1", text)
    return int(eval(text, {"__builtins__": {}, "min": min, "max": max}, env))  # noqa: S307 - our own printed C


def numpy_strides(t: TensorArg, sizes: dict[str, int]) -> tuple[int, ...]:
    shape = tuple(a.evaluate(sizes) for a in t.dims)
    return tuple(s // 2 for s in np.empty(shape, dtype=np.float16).strides)


def stride_errors(k: Kernel, sizes: dict[str, int], rng: random.Random) -> list[str]:
    """Every printed address of the fold's operands compared with numpy's strides of its layout."""
    plan, mask = online_fold.match(k, "online_fold wgmma")
    plan = with_roles(plan)
    env = {f"sz_{n}": v for n, v in sizes.items()}
    printed = attn_addressing(plan, Sizes(plan))
    wctx = wgmma_context(plan, online_fold.mask_context(mask, plan), True)
    errors = []
    for key, op in (("q", plan.q), ("k", plan.k), ("v", plan.v), ("o", plan.o)):
        strides = numpy_strides(k.tensor(op.name), sizes)
        seq = op.roles.index("seq")
        if c_eval(printed[f"ld_{key}"], env) != strides[seq]:
            errors.append(f"{op.name}: row stride {printed[f'ld_{key}']} != numpy {strides[seq]}")
        for _ in range(4):
            bi = {g.loop: rng.randrange(max(1, -(-sizes[g.dim] // g.tile))) for g in plan.grid}
            want = sum(bi[r] * s for r, s in zip(op.roles, strides) if r not in ("seq", "head"))
            got = c_eval(printed[f"off_{key}"], {**env, **{f"bi_{n}": v for n, v in bi.items()}})
            if got != want:
                errors.append(f"{op.name}: batch offset {printed[f'off_{key}']} = {got} at {bi}, numpy {want}")
            if key == "o":
                continue
            # the TMA view: element (row, col) of this block's tile through the map's dims and strides
            dims, tstrides = tma_view(op, sizes)
            coords = [c_eval(c, {**env, **{f"bi_{n}": v for n, v in bi.items()}})
                      for c in wctx[f"{key}_coords"].split(", ")[1:]]
            if len(dims) != wctx[f"{key}_rank"] or len(coords) != len(dims) - 2:
                errors.append(f"{op.name}: TMA rank {wctx[f'{key}_rank']}, view {dims}, coords {coords}")
                continue
            row, col = rng.randrange(sizes[op.dims[seq]] or 1), rng.randrange(dims[0])
            offset = col + row * tstrides[0] + sum(c * s for c, s in zip(coords, tstrides[1:]))
            if any(not 0 <= c < n for c, n in zip(coords, dims[2:])):
                errors.append(f"{op.name}: TMA coordinates {coords} outside the view {dims}")
            if offset != want + row * strides[seq] + col:
                errors.append(f"{op.name}: TMA view {dims} / {tstrides} at {coords} reads {offset}, "
                              f"numpy {want + row * strides[seq] + col}")
    # the mma.sync printer addresses the K / V tiles with the same strides
    mctx = _attention_ctx(replace(plan, mma="mma_sync", block_n=64, stages=2), online_fold.mask_context(mask, plan))
    for key in ("q", "k", "v", "o"):
        if mctx[f"ld_{key}"] != printed[f"ld_{key}"] or mctx[f"off_{key}"] != printed[f"off_{key}"]:
            errors.append(f"mma.sync {key}: {mctx[f'ld_{key}']} / {mctx[f'off_{key}']} differ from the wgmma printer")
    return errors


LAYOUT_SIZES = {"flash_attention_wgmma": {"B": 3, "H": 5, "N": 77, "D": 128},
                "attention_gqa": {"B": 2, "HK": 3, "G": 4, "N": 333, "D": 128}}


@pytest.mark.parametrize("example,seed", [(e, s) for e in LAYOUT_SIZES for s in range(24)])
def test_generated_layouts_print_numpy_strides_or_are_refused_by_name(example, seed):
    k = kernel_of(example)
    rng = random.Random(seed)
    perms = {}
    for t in k.tensors:
        n = len(t.dims)
        perm = list(range(n))
        if seed and rng.random() < 0.9:  # any order of the other dims, the head dim last
            perm = rng.sample(range(n - 1), n - 1) + [n - 1]
        elif seed:  # seed 0: the example's own layout
            rng.shuffle(perm)
        perms[t.name] = tuple(perm)
    pk = permuted(k, perms)
    head_last = all(perms[t.name][-1] == len(t.dims) - 1 for t in k.tensors)
    if not head_last:
        with pytest.raises(UnsupportedMapping, match="not innermost"):
            online_fold.match(pk, "online_fold wgmma")
        return
    assert stride_errors(pk, LAYOUT_SIZES[example], rng) == []


def test_all_permutations_with_the_head_dim_last_are_addressed():
    k = kernel_of("flash_attention_wgmma")
    rng = random.Random(3)
    for perm in itertools.permutations(range(3)):
        pk = permuted(k, {t.name: perm + (3,) for t in k.tensors})
        assert stride_errors(pk, {"B": 2, "H": 3, "N": 200, "D": 128}, rng) == [], perm


def test_bnhd_is_read_off_the_kernel_ir():
    plan, _ = online_fold.match(kernel_of("flash_attention_wgmma"), "m")
    bnhd = permuted(kernel_of("flash_attention_wgmma"), {t: (0, 2, 1, 3) for t in "QKVO"})
    plan2, _ = online_fold.match(bnhd, "m")
    assert plan.q.roles == ("b", "h", "seq", "head") and plan2.q.roles == ("b", "seq", "h", "head")
    assert plan2.o.dims == ("B", "N", "H", "D")


def test_gqa_shares_k_and_v_across_the_group():
    plan, _ = online_fold.match(kernel_of("attention_gqa"), "m")
    assert plan.q.roles == ("b", "hk", "g", "seq", "head") and plan.k.roles == ("b", "hk", "seq", "head")
    assert [(g.loop, g.axis) for g in plan.grid] == [("b", "z"), ("hk", "y"), ("g", "y"), ("io", "x")]
    sizes = {"B": 2, "HK": 3, "G": 4, "N": 300, "D": 128}
    assert tma_view(plan.q, sizes) == ([128, 300, 24], [128, 300 * 128])
    assert tma_view(plan.k, sizes) == ([128, 300, 6], [128, 300 * 128])


def test_unaddressable_index_maps_are_refused_by_name():
    k = kernel_of("flash_attention_wgmma")
    # K read at a head index shifted by one: neither the rows, the head dim nor a block index
    def shift(e):
        if isinstance(e, Select):
            return replace(e, then=shift(e.then))
        if isinstance(e, Read) and e.tensor == "K":
            return replace(e, idx=(e.idx[0], e.idx[1] + 1, e.idx[2], e.idx[3]))
        return e

    loop = next(s for s in k.body if isinstance(s, TileLoop))
    body = tuple(replace(s, value=shift(s.value)) if isinstance(s, Stage) else s for s in loop.body)
    bad = replace(k, body=tuple(replace(s, body=body) if s is loop else s for s in k.body))
    with pytest.raises(UnsupportedMapping, match="neither the tile rows"):
        online_fold.match(bad, "online_fold wgmma")
    # K read at the query tile (it must not depend on it)
    def at_qtile(e):
        if isinstance(e, Select):
            return replace(e, then=at_qtile(e.then))
        if isinstance(e, Read) and e.tensor == "K":
            from compiler.ir import Aff
            return replace(e, idx=(e.idx[0], Aff.of("io"), e.idx[2], e.idx[3]))
        return e

    body = tuple(replace(s, value=at_qtile(s.value)) if isinstance(s, Stage) else s for s in loop.body)
    bad = replace(k, body=tuple(replace(s, body=body) if s is loop else s for s in k.body))
    with pytest.raises(UnsupportedMapping, match="neither the tile rows"):
        online_fold.match(bad, "online_fold wgmma")


# ------------------------------------------------------------------ shared grid axes
def grid_bijection_errors(dims: list[tuple[str, int, str]]) -> list[str]:
    """Every block of each axis decodes to one distinct tuple of loop indices in range, row-major."""
    exprs = block_index_c([(v, str(n), a) for v, n, a in dims])
    blocks = axis_blocks([(a, n) for _, n, a in dims])
    seen, errors = set(), []
    for bx, by, bz in itertools.product(*(range(n) for n in blocks)):
        env = {"blk_x": bx, "blk_y": by, "blk_z": bz}
        point = tuple(c_eval(exprs[v], env) for v, _, _ in dims)
        if any(not 0 <= p < n for p, (_, n, _) in zip(point, dims)):
            errors.append(f"block {(bx, by, bz)} decodes to {point}, out of range")
        seen.add(point)
        for axis, b in (("x", bx), ("y", by), ("z", bz)):
            on = [(p, n) for p, (_, n, a) in zip(point, dims) if a == axis]
            flat = 0
            for p, n in on:
                flat = flat * n + p
            if on and flat != b:
                errors.append(f"block {axis}={b} decodes to {on}: not row-major")
    want = 1
    for _, n, _ in dims:
        want *= n
    if len(seen) != want:
        errors.append(f"{len(seen)} distinct points for {want} iterations")
    return errors


@pytest.mark.parametrize("dims", [
    [("b", 2, "z"), ("hk", 3, "y"), ("g", 4, "y"), ("io", 5, "x")],
    [("a", 3, "x"), ("b", 2, "x"), ("c", 5, "x")],
    [("a", 1, "y"), ("b", 7, "y"), ("c", 2, "z")],
    [("a", 4, "x")],
])
def test_shared_grid_axis_enumerates_the_product_row_major(dims):
    assert grid_bijection_errors(dims) == []


def test_mutated_block_index_is_caught(monkeypatch):
    dims = [("hk", 3, "y"), ("g", 4, "y")]
    good = block_index_c([(v, str(n), a) for v, n, a in dims])
    monkeypatch.setattr("test_attention_layouts.block_index_c",
                        lambda d: {**good, "hk": good["hk"].replace("/", "%")})
    assert grid_bijection_errors(dims) != []


def test_mutated_stride_printer_is_caught(monkeypatch):
    k = permuted(kernel_of("flash_attention_wgmma"), {t: (0, 2, 1, 3) for t in "QKVO"})
    sizes = {"B": 2, "H": 3, "N": 100, "D": 128}
    assert stride_errors(k, sizes, random.Random(0)) == []
    # the mutation: row strides as if the layout were contiguous [.., N, D] (the old assumption)
    orig = ctx_common.Sizes.stride_at
    monkeypatch.setattr(ctx_common.Sizes, "stride_at",
                        lambda self, op, pos: "128" if op.roles and op.roles[pos] == "seq" else orig(self, op, pos))
    assert any("row stride" in e for e in stride_errors(k, sizes, random.Random(0)))


def test_runtime_sizes_a_shared_axis_as_the_product_and_checks_its_limit():
    from test_runtime_geometry import geometry_only

    ck = geometry_only("attention_gqa")
    q, kv = (2, 3, 4, 300, 128), (2, 3, 300, 128)
    geo = ck._shape((q, kv, kv))
    assert geo.sizes["G"] == 4 and geo.grids[0] == (3, 12, 2)
    with pytest.raises(ValueError, match="grid axis y needs 66000 blocks \\(HK \\* G\\)"):
        ck._shape(((1, 16500, 4, 10, 128), (1, 16500, 10, 128), (1, 16500, 10, 128)))


def test_parallel_step_records_the_shared_axis(tmp_path):
    path = ROOT / "examples" / "attention_gqa.yaml"
    d = derive(load_spec_file(path), str(path), seed=1)
    step = next(s for s in d.steps if s.rule == "parallel" and s.raw_facts.get("loop") == "g")
    assert step.raw_facts["shares_axis_with"] == ["hk"]


# ------------------------------------------------------------------ the examples through NVRTC / SASS
@pytest.mark.parametrize("example", ["flash_attention_wgmma_bnhd", "attention_gqa"])
def test_new_examples_build_to_wgmma_kernels(example, example_build):
    from codegen.cuda.nvrtc import nvrtc_available

    b = example_build(ROOT / "examples" / f"{example}.yaml")  # the run's shared build (seed 0)
    assert b.rc == 0, b.stderr
    out = b.out
    plan = json.loads((out / "plan.json").read_text())
    assert plan["mapping"] == "online_fold_wgmma"
    src = (out / "kernel.cu").read_text()
    if example == "attention_gqa":
        assert "tma_load_3d(sK" in src and "% (sz_G)" in src and "/ ((sz_G))" in src
    else:
        assert "tma_load_4d(sQ" in src and "(long long)row * ((long long)sz_H * 128)" in src
    if not nvrtc_available():
        pytest.skip("NVRTC not installed")
    sass = json.loads((out / "sass.json").read_text())
    assert sass["violations"] == [] and sass["hgmma"] and sass["local_memory_ops"] == 0


# ------------------------------------------------------------------ the PARALLEL obligation of a shared axis
@pytest.fixture(scope="module")
def coq_lib(tmp_path_factory):
    from compiler.verify import coq_library

    return coq_library(tmp_path_factory.mktemp("coqlib"))


def _axis_obligation(tmp: Path, lib: Path) -> tuple[str, bool]:
    from compiler import obligations
    from proofs_ci import coqlib

    path = ROOT / "examples" / "attention_gqa.yaml"
    d = derive(load_spec_file(path), str(path), check=False, upto=15)
    files = obligations.write_obligations(d, tmp / "proofs")
    index = json.loads((tmp / "proofs" / "index.json").read_text())["steps"]
    e = next(e for e in index if e["kind"] == "PARALLEL" and "grid_axis" in
             (tmp / "proofs" / e["files"]["coq"]).read_text())
    vfile = tmp / "proofs" / e["files"]["coq"]
    assert vfile in files
    return vfile.read_text(), coqlib.check_obligation(vfile, lib).returncode == 0


def test_shared_axis_obligation_is_checked_by_coq(tmp_path, coq_lib):
    if coq_lib is None:
        pytest.skip("no coqc")
    text, ok = _axis_obligation(tmp_path, coq_lib)
    assert "grid_axis_product" in text and "Nat.modulo" in text and ok


def test_wrong_axis_decoding_fails_its_obligation(tmp_path, coq_lib, monkeypatch):
    """Mutation: claim the joining loop is the block index divided by E (outer and inner swapped)."""
    if coq_lib is None:
        pytest.skip("no coqc")
    from compiler import obligations as ob_mod

    real = ob_mod._grid_axis_thm

    def swapped(rec, before, after):
        t = real(rec, before, after)
        lt, div_eq, mod_eq = t.concl[1]
        return replace(t, concl=("conj", [lt, ("eq", div_eq[1], mod_eq[2]), ("eq", mod_eq[1], div_eq[2])]))

    monkeypatch.setattr(ob_mod, "_grid_axis_thm", swapped)
    _, ok = _axis_obligation(tmp_path, coq_lib)
    assert not ok
