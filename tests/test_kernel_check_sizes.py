"""The kernel step's `wide` draw: every tiled dynamic size at 4.5 of the kernel's own largest tile.

A chain kernel is handed the whole derivation's tiles (compiler.kernel_chain): the split-K partial
sums of the tuned GEMM must not run at 4.5 of the combine's 1024-column tile (N = 4616, a
1.6-GMAC emulated GEMM per variant), only at 4.5 of their own tile; the combine keeps its 1024."""
from __future__ import annotations

from pathlib import Path

import pytest

from codegen.build import kernel_name, largest_tiles, print_checked
from codegen.kernel_check import kernel_tiles, wide_sizes
from codegen.kir.lower import lower
from compiler.derive import derive
from compiler.kernel_chain import chain_of, kernel_derivations
from compiler.schedule_variants import expand
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]


def printed_kernels(example: str, variant: str | None = None) -> dict:
    """{kernel definition: (printed kernel, the tiles the build hands its kernel step)}."""
    spec_path = ROOT / "examples" / f"{example}.yaml"
    variants = expand(load_spec_file(spec_path))
    spec = next(v.spec for v in variants if variant is None or v.name == variant)
    d = derive(spec, str(spec_path), seed=0, check=False)
    kernels = kernel_derivations(d) if chain_of(d) else [d]
    return {k.final.output: (print_checked(lower(k.final, kernel_name(k))), getattr(k, "tiles", None) or largest_tiles(k))
            for k in kernels}


def test_split_k_partials_are_wide_in_their_own_tiles_the_combine_in_its_own():
    kernels = printed_kernels("gemm_splitk_tiles_tuned", "tile_i-128_tile_j-128_split_k-4")
    check = {"M": 150, "N": 270, "K": 300}
    part, tiles = kernels["C_part"]
    assert tiles["N"] == 1024  # the combine's tile, handed to every kernel of the chain
    assert kernel_tiles(part.kernel)["N"] == 128
    assert wide_sizes(part, check, tiles) == {"M": 584, "N": 584, "K": 296}
    combine, tiles = kernels["C"]
    assert kernel_tiles(combine.kernel) == {"N": 1024}
    assert wide_sizes(combine, check, tiles) == {"M": 584, "N": 4616, "K": 300}


@pytest.mark.parametrize("example", ["gemm_wgmma", "flash_attention"])
def test_one_kernel_builds_keep_the_derivation_tiles(example):
    (printed, tiles), = printed_kernels(example).values()
    own = kernel_tiles(printed.kernel)
    assert all(own.get(n, t) >= t for n, t in tiles.items())  # nothing to hold: the same sizes as before
