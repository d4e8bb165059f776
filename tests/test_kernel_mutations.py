"""The mutation suite of the `kernel` step: a semantic change to a template or a printer must make
`derivc build` fail at the `kernel` step (the printed text run on the CPU against the spec).

Each mutation edits one file of a private copy of codegen/ and runs the codegen checks of one
example's build with that copy on the build's derivation (derivc_testing.codegen_checks_of_mutant:
derived once per example, checked in a forked child); the `kernel` step must fail.  The first ten are the ones a hostile audit on 2026-12-01 slipped past every CPU
check (issue 15); the rest cover the instructions the emulation stands for (swizzle, pipeline
depth, mbarrier waits, ldmatrix, descriptors), the printers (epilogue, grid decode), SPLIT-KV's
partial fold on mma.sync (strided key tiles, the stored state) and GQA decode's packed rows.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from derivc_testing import codegen_checks_of_mutant

ROOT = Path(__file__).resolve().parents[1]
T = "codegen/mappings/templates/"


@dataclass(frozen=True)
class Mutation:
    name: str
    example: str
    path: str  # relative to the repository root
    old: str
    new: str
    occurrence: int = 1  # which occurrence of `old` is replaced (1-based)


MUTATIONS = (
    # --- the audit's ten
    Mutation("mma_fold_drops_l_rescale", "flash_attention.yaml", T + "online_fold.cu.j2",
             "l_r[mi][h] *= alpha;", ""),
    Mutation("mma_fold_drops_acc_rescale", "flash_attention.yaml", T + "online_fold.cu.j2",
             "o[mi][dt][2 * h] *= alpha; o[mi][dt][2 * h + 1] *= alpha;", ""),
    Mutation("wgmma_fold_drops_l_rescale", "flash_attention_wgmma.yaml", T + "online_fold_wgmma.cu.j2",
             "l_r[h] = l_r[h] * alpha[h] + ls;", "l_r[h] = l_r[h] + ls;"),
    Mutation("wgmma_fold_drops_acc_rescale", "flash_attention_wgmma.yaml", T + "online_fold_wgmma.cu.j2",
             "{{ wa.rescale_rows('o', 'alpha', D) | indent(12) }}", ""),
    Mutation("mask_le_printed_as_lt", "flash_attention.yaml", "codegen/mappings/cexpr.py",
             'return f"({aff_c(c.lhs, names)} {c.op} {aff_c(c.rhs, names)})"',
             'return f"({aff_c(c.lhs, names)} {\'<\' if c.op == \'<=\' else c.op} {aff_c(c.rhs, names)})"'),
    Mutation("fold_tail_store_unguarded", "flash_attention.yaml", T + "online_fold.cu.j2",
             "{%- set rl = (Nq ~ ' - q0') if (guard_q and tail) else None %}", "{%- set rl = None %}"),
    Mutation("fold_store_row_col_swapped", "flash_attention.yaml", T + "online_fold.cu.j2",
             "{{ mm.store_pair('gO', ld_o, 'rr', 'cc',", "{{ mm.store_pair('gO', ld_o, 'cc', 'rr',"),
    Mutation("rowwise_rescale_reversed", "softmax_online.yaml", T + "rowwise.cu.j2",
             "expf(a == b ? 0.0f : a - b)", "expf(a == b ? 0.0f : b - a)"),
    Mutation("block_sum_from_half_warp", "layernorm.yaml", T + "rowwise.cu.j2",
             "for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync", "for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync"),
    Mutation("wgmma_gemm_column_guard_dropped", "gemm_wgmma.yaml", T + "contraction_wgmma.cu.j2",
             "if (col + e >= sz_lim_n) break;", ""),
    # --- instructions and pipelines
    Mutation("wgmma_descriptor_swizzle_64B", "gemm_wgmma.yaml", T + "constructs/wgmma.cu.j2",
             "(1ull << 62)", "(2ull << 62)"),
    # (a swizzle that stays a permutation is a bank-conflict change, not a semantic one: or is not)
    Mutation("mma_sync_swizzle_not_a_permutation", "gemm.yaml", T + "constructs/common.cu.j2",
             "(((c / {{ vec }}) ^ (r & 7)))", "(((c / {{ vec }}) | (r & 7)))"),
    Mutation("cp_async_pipeline_one_stage_short", "gemm.yaml", T + "contraction.cu.j2",
             "cp_async_wait<{{ stages - 2 }}>();", "cp_async_wait<{{ stages - 1 }}>();"),
    Mutation("tma_next_k_tile_not_waited", "flash_attention_wgmma.yaml", T + "online_fold_wgmma.cu.j2",
             "mbar_wait(bar_k + 8 * ns, nph);", ""),
    Mutation("tma_q_tile_not_waited", "flash_attention_wgmma.yaml", T + "online_fold_wgmma.cu.j2",
             "mbar_wait(bar_q, 0);", ""),
    Mutation("ldmatrix_b_not_transposed", "gemm.yaml", T + "contraction.cu.j2",
             "ldsm_x4_t(bf[", "ldsm_x4(bf["),
    Mutation("ldmatrix_v_not_transposed", "flash_attention.yaml", T + "online_fold.cu.j2",
             "ldsm_x4_t(vb[", "ldsm_x4(vb["),
    Mutation("epilogue_drops_a_term", "gemm_bias_relu.yaml", "codegen/mappings/epilogue.py",
             'return f"({a} {BINARY[e.op]} {b})"', 'return f"({a})" if e.op == "+" else f"({a} {BINARY[e.op]} {b})"'),
    Mutation("gqa_head_map_wrong", "attention_gqa.yaml", "codegen/kir/grid.py",
             "x = f\"({x} / (", "x = f\"({x} % ("),
    Mutation("wgmma_fold_mask_dropped", "attention_strict_causal.yaml", T + "online_fold_wgmma.cu.j2",
             "{{ mask_keep('row', 'col', '(kv0 / ' ~ BN ~ ')') }} ? sv : neg_inf()", "sv"),
    # --- the gradient GEMM layouts (A stored [K, M]): the transpose the instruction applies
    Mutation("ldmatrix_a_not_transposed", "gemm_grad_b.yaml", T + "contraction.cu.j2",
             "ldsm_x4_t(af[", "ldsm_x4(af["),
    Mutation("wgmma_a_transpose_bit_cleared", "gemm_grad_b_wgmma.yaml", T + "contraction_wgmma.cu.j2",
             "{{ instr.wgmma_ss('wgmma_tile', WN, ab_dt, trans_b, trans_a) }}",
             "{{ instr.wgmma_ss('wgmma_tile', WN, ab_dt, trans_b, False) }}"),
    Mutation("rowwise_division_unguarded_by_sign", "rmsnorm.yaml", "codegen/mappings/rowwise.py",
             'return f"div0({a}, {b})"', 'return f"div0({b}, {a})"'),
    # --- FOLD-STAT's second output (LSE = m + log l): a wrong statistic fails at the kernel step
    # the LSE and split-state stores have a packed-rows branch (GQA decode) before the unpacked one:
    # each mutation names the store it breaks
    Mutation("mma_lse_forgets_log", "flash_attention_d64_lse.yaml", T + "online_fold.cu.j2",
             "gL[(long long)lr * ({{ ld_lse }})] = m_r[mi][h] * 0.693147180559945309f + logf(l);",
             "gL[(long long)lr * ({{ ld_lse }})] = m_r[mi][h] * 0.693147180559945309f + l;"),
    Mutation("mma_lse_max_in_log2_units", "flash_attention_d64_lse.yaml", T + "online_fold.cu.j2",
             "gL[(long long)lr * ({{ ld_lse }})] = m_r[mi][h] * 0.693147180559945309f",
             "gL[(long long)lr * ({{ ld_lse }})] = m_r[mi][h]"),
    Mutation("mma_lse_row_of_the_upper_half", "flash_attention_d64_lse.yaml", T + "online_fold.cu.j2",
             "(lane >> 2) + 8 * h;", "(lane >> 2);", occurrence=2),  # the first is SPLIT-KV's state store
    Mutation("split_kv_mma_state_row_of_the_upper_half", "decode_splitkv.yaml", T + "online_fold.cu.j2",
             "(lane >> 2) + 8 * h;", "(lane >> 2);"),
    Mutation("wgmma_lse_forgets_log", "flash_attention_wgmma_lse.yaml", T + "online_fold_wgmma.cu.j2",
             "m_r[h] * 0.693147180559945309f + logf(l)", "m_r[h] * 0.693147180559945309f + l"),
    # --- SPLIT-KV's partial fold on mma.sync: the strided key tile, the unnormalised acc, m's units
    Mutation("split_kv_mma_drops_the_strided_tile", "decode_splitkv.yaml", "codegen/mappings/online_fold.py",
             "key_tile = mask.key_tile if mask.key_tile is not None else Aff.of(mask.ktile)",
             "key_tile = Aff.of(mask.ktile)"),
    Mutation("split_kv_mma_stores_acc_over_l", "decode_splitkv.yaml", T + "online_fold.cu.j2",
             "inv[h] = 1.0f;", "inv[h] = l > 0.0f ? 1.0f / l : 0.0f;"),
    Mutation("split_kv_mma_m_in_log2_units", "decode_splitkv.yaml", T + "online_fold.cu.j2",
             "gM[(long long)lr * ({{ ld_m }})] = 0.693147180559945309f * m_r[mi][h];",
             "gM[(long long)lr * ({{ ld_m }})] = m_r[mi][h];"),
    Mutation("split_kv_mma_packed_m_in_log2_units", "decode_splitkv_gqa.yaml", T + "online_fold.cu.j2",
             "gM[{{ row_off('lr', ld_m, ldp_m) }}] = 0.693147180559945309f * m_r[mi][h];",
             "gM[{{ row_off('lr', ld_m, ldp_m) }}] = m_r[mi][h];"),
    # --- GQA decode's packed rows: a row paired with another head of the group
    Mutation("gqa_packed_row_head_column_major", "decode_splitkv_gqa.yaml", "codegen/mappings/render.py",
             'return f"((long long)(({r}) / {bm}) * ({ldp})', 'return f"((long long)(({r}) % {p.pack}) * ({ldp})'),
    Mutation("gqa_packed_q_read_at_the_row_stride", "decode_splitkv_gqa.yaml", T + "online_fold.cu.j2",
             "row_off(r, ld_q, ldp_q)", "row_off(r, ld_q, ld_q)"),
)


def apply(m: Mutation, root: Path) -> None:
    path = root / m.path
    text = path.read_text()
    at = -1
    for _ in range(m.occurrence):
        at = text.find(m.old, at + 1)
        assert at >= 0, f"{m.name}: {m.old!r} not found in {m.path} (the site moved: update the mutation)"
    path.write_text(text[:at] + m.new + text[at + len(m.old):])


def assert_caught_at_the_kernel_step(m: Mutation, copy: Path) -> str:
    """Mutate a copy of codegen/ and run the example's codegen checks with it (derivc_testing.
    codegen_checks_of_mutant: the build's derivation, derived once per process): the `kernel`
    step must fail.  Returns the failure ("KERNEL: kernel: ...")."""
    assert m.path.startswith("codegen/"), f"{m.name}: a mutation outside codegen/ needs a subprocess build"
    shutil.copytree(ROOT / "codegen", copy / "codegen", ignore=shutil.ignore_patterns("__pycache__"))
    apply(m, copy)
    failure = codegen_checks_of_mutant(ROOT / "examples" / m.example, copy, seed=7)
    assert failure is not None, f"{m.name}: every kernel of the mutated build passed its checks"
    assert ": kernel: " in failure, f"{m.name}: failed, but not at the kernel step: {failure[-600:]}"
    return failure


def mutation_params(mutations: tuple[Mutation, ...]) -> list:
    """One parameter per mutation, in the xdist group of its example: the example is derived
    once, by the worker that runs its mutants (and its shared build)."""
    return [pytest.param(m, id=m.name, marks=pytest.mark.xdist_group(f"example-{Path(m.example).stem}"))
            for m in mutations]


@pytest.mark.parametrize("m", mutation_params(MUTATIONS))
def test_mutation_fails_at_the_kernel_step(m: Mutation, tmp_path: Path) -> None:
    assert_caught_at_the_kernel_step(m, tmp_path)


def test_an_unmutated_copy_passes_every_kernel_step(tmp_path: Path) -> None:
    """The helper's failures come from the mutations: the copy as it is passes (the split-KV chain:
    both of its kernels)."""
    shutil.copytree(ROOT / "codegen", tmp_path / "codegen", ignore=shutil.ignore_patterns("__pycache__"))
    assert codegen_checks_of_mutant(ROOT / "examples" / "decode_splitkv.yaml", tmp_path, seed=7) is None


def test_mutations_name_distinct_sites() -> None:
    sites = {(m.path, m.old, m.occurrence) for m in MUTATIONS}
    assert len(sites) == len(MUTATIONS)
    for m in MUTATIONS:
        assert (ROOT / "examples" / m.example).exists(), m.example
        assert m.old in (ROOT / m.path).read_text(), f"{m.name}: site not in {m.path}"
