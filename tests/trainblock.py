"""The training block's derived pieces (issue 16's training test): a pre-norm transformer block
RMSNorm → attention → residual → RMSNorm → GEMM + bias + GELU → GEMM + residual, each op a spec
with `grad:` (tests/gpu/train_block/*.yaml, attention: examples/flash_attention_grad.yaml).

Used by tests/test_training_block.py (every piece builds with its backward; the backward run
through the emulation against float64 formulas) and tests/gpu/test_training_block_gpu.py (200
training steps against the same block in PyTorch eager)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC_DIR = ROOT / "tests" / "gpu" / "train_block"

D_MODEL = 256  # fixed by rmsnorm_grad.yaml (C)
HEAD_DIM = 64  # fixed by flash_attention_grad.yaml (D)

# piece -> (spec, the inputs its gradients are taken with respect to)
PIECES: dict[str, tuple[Path, tuple[str, ...]]] = {
    "rmsnorm": (SPEC_DIR / "rmsnorm_grad.yaml", ("X", "W")),
    "gemm": (SPEC_DIR / "gemm_grad.yaml", ("A", "B")),
    "attention": (ROOT / "examples" / "flash_attention_grad.yaml", ("Q", "K", "V")),
    "gemm_residual": (SPEC_DIR / "gemm_residual_grad.yaml", ("A", "B", "C0")),
    "gemm_bias_gelu": (SPEC_DIR / "gemm_bias_gelu_grad.yaml", ("A", "B", "bias")),
}


def build_piece(name: str, root: Path) -> Path:
    """root/<name>: the piece's forward build with grad/ and grad.json (no proofs)."""
    from compiler.cli import build_to

    out = root / name
    build_to(PIECES[name][0], out, seed=1, proofs=False)
    return out


def build_block(root: Path) -> dict[str, Path]:
    """Every piece built under root: {piece: build directory}."""
    return {name: build_piece(name, root) for name in PIECES}
