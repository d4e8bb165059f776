"""Test support for derivc_emu_ops.h: builds tests/emu/ops_driver.cpp (its extern "C" face) once
per content hash into the temp dir, calls it through ctypes with numpy arrays, and holds the
numpy models of the mma.sync fragment layouts that several test modules share."""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parents[1] / "codegen" / "emu" / "include"
DRIVER = HERE / "ops_driver.cpp"
FLAGS = ["-std=c++17", "-O1", "-fno-strict-aliasing", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"]


class OpsError(RuntimeError):
    """derivc_emu::fail called inside an instruction."""


def build_driver() -> Path:
    key = hashlib.sha256(b"\0".join([DRIVER.read_bytes(), (INCLUDE / "derivc_emu_ops.h").read_bytes(),
                                     " ".join(FLAGS).encode()])).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / "derivc_emu_ops_tests" / f"ops_{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["g++", *FLAGS, f"-I{INCLUDE}", str(DRIVER), "-o", str(tmp)], check=True)
        os.replace(tmp, out)
    return out


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)


class Ops:
    """numpy-friendly calls into the driver; instruction errors raise OpsError."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.t_pack_f16x2.restype = self.lib.t_pack_bf16x2.restype = ctypes.c_uint32
        self.lib.t_pack_f16x2.argtypes = self.lib.t_pack_bf16x2.argtypes = [ctypes.c_float] * 2

    def _check(self, rc: int, err: ctypes.Array) -> None:
        if rc:
            raise OpsError(err.value.decode())

    def convert(self, fn: str, x: np.ndarray) -> np.ndarray:
        src_t, dst_t = {"f32_to_f16": (np.float32, np.uint16), "f32_to_bf16": (np.float32, np.uint16),
                        "f16_to_f32": (np.uint16, np.float32), "bf16_to_f32": (np.uint16, np.float32)}[fn]
        x = np.ascontiguousarray(x, dtype=src_t)
        out = np.empty(x.shape, dtype=dst_t)
        getattr(self.lib, "t_" + fn)(_ptr(x), _ptr(out), ctypes.c_int(x.size))
        return out

    def pack(self, dtype: str, hi: float, lo: float) -> int:
        return getattr(self.lib, f"t_pack_{dtype}x2")(hi, lo)

    def ldmatrix(self, smem: np.ndarray, addr: np.ndarray, trans: bool) -> np.ndarray:
        addr = np.ascontiguousarray(addr, dtype=np.uint32)
        out = np.zeros((32, 4), dtype=np.uint32)
        err = ctypes.create_string_buffer(512)
        self._check(self.lib.t_ldmatrix(_ptr(smem), ctypes.c_uint32(smem.size), _ptr(addr),
                                        ctypes.c_int(trans), _ptr(out), err), err)
        return out

    def mma(self, dtype: str, a: np.ndarray, b: np.ndarray, d: np.ndarray) -> np.ndarray:
        a, b = (np.ascontiguousarray(x, dtype=np.uint32) for x in (a, b))
        d = np.array(d, dtype=np.float32, order="C")
        err = ctypes.create_string_buffer(512)
        self._check(self.lib.t_mma(ctypes.c_int(dtype == "bf16"), _ptr(a), _ptr(b), _ptr(d), err), err)
        return d

    def wgmma(self, dtype: str, n: int, smem: np.ndarray, desc_a: int, a_regs: np.ndarray | None,
              desc_b: int, tnsp_a: int, tnsp_b: int, scale_d: int, d: np.ndarray) -> np.ndarray:
        d = np.array(d, dtype=np.float32, order="C")
        assert d.shape == (128, n // 2)
        regs = None if a_regs is None else np.ascontiguousarray(a_regs, dtype=np.uint32)
        err = ctypes.create_string_buffer(512)
        rc = self.lib.t_wgmma(ctypes.c_int(dtype == "bf16"), ctypes.c_int(n), _ptr(smem),
                              ctypes.c_uint32(smem.size), ctypes.c_uint64(desc_a),
                              None if regs is None else _ptr(regs), ctypes.c_uint64(desc_b),
                              ctypes.c_int(tnsp_a), ctypes.c_int(tnsp_b), ctypes.c_int(scale_d), _ptr(d), err)
        self._check(rc, err)
        return d

    def tma(self, tensor_map: bytes, coords: list[int], smem: np.ndarray, dst: int, rank: int = -1) -> int:
        raw = np.frombuffer(tensor_map, dtype=np.uint8).copy()
        c = np.array(coords, dtype=np.int32)
        nbytes = ctypes.c_uint32(0)
        err = ctypes.create_string_buffer(512)
        self._check(self.lib.t_tma(_ptr(raw), ctypes.c_int(rank), _ptr(c), _ptr(smem), ctypes.c_uint32(smem.size),
                                   ctypes.c_uint32(dst), ctypes.byref(nbytes), err), err)
        return nbytes.value


# ------------------------------------------------------------------ fragment models (PTX ISA)

LANES = np.arange(32)
G, Q = LANES // 4, LANES % 4


def random_elements(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """16-bit patterns of finite values of a few magnitudes (signed, some zeros)."""
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 6, shape)).astype(np.float32)
    x[rng.random(shape) < 0.05] = 0.0
    if dtype == "f16":
        return x.astype(np.float16).view(np.uint16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def to_f32(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def pack(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)


def a_fragment(A: np.ndarray) -> np.ndarray:
    """[32][4] registers of a 16 x 16 A: a0 (g, 2q..) a1 (g+8, 2q..) a2 (g, 2q+8..) a3 (g+8, 2q+8..)."""
    regs = [(G, 2 * Q), (G + 8, 2 * Q), (G, 2 * Q + 8), (G + 8, 2 * Q + 8)]
    return np.stack([pack(A[r, c], A[r, c + 1]) for r, c in regs], axis=1)


def b_fragment(B: np.ndarray) -> np.ndarray:
    """[32][2] registers of a 16 (k) x 8 (n) B: b0 (k 2q, 2q+1; n g), b1 (k 2q+8, 2q+9; n g)."""
    return np.stack([pack(B[2 * Q, G], B[2 * Q + 1, G]), pack(B[2 * Q + 8, G], B[2 * Q + 9, G])], axis=1)


def c_fragment_index() -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of d[l][e]: e 0, 1 -> (g, 2q + e); e 2, 3 -> (g + 8, 2q + e - 2)."""
    e = np.arange(4)
    return G[:, None] + 8 * (e[None, :] >> 1), 2 * Q[:, None] + (e[None, :] & 1)


def matmul_k_order(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> np.ndarray:
    """C + A B in float32, one k at a time (the emulator's documented summation order)."""
    acc = C.astype(np.float32).copy()
    for k in range(A.shape[1]):
        acc = acc + A[:, k:k + 1] * B[k:k + 1, :]
    return acc
