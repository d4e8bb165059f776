"""The contraction epilogue (codegen/mappings/epilogue.py): the kernel IR's stored value printed to C.

- Generated epilogues (random trees over the accumulator, guarded reads bias[j], bias[N-1-j],
  C0[i, j], C0[j, i], index values, constants, + - * / max gt and the unary functions) are printed
  through the real contraction matcher, compiled on the host with g++ against bounds-checked
  arrays and compared with a float64 evaluation of the kernel IR expression, on interior and tail
  blocks: no read out of bounds, the interior predicate holds only where every read is in range.
- Mutations of the printer (dropping the bias, reading bias at the row instead of the column,
  dropping a guard, a wrong interior predicate) are caught by that comparison.
- What the printer cannot print is refused by name; the example schedules build through NVRTC
  and SASS on both the wgmma and the mma.sync mapping; the binding (fuse_let) of a pre-activation read several times.
"""
from __future__ import annotations

import math
import random
import shutil
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from codegen.mappings import epilogue as epi_mod
from codegen.kir.lower import UnsupportedMapping, lower
from codegen.mappings.contraction import match
from compiler.derive import derive
from compiler.ir import Aff, Bin, Cond, Const, IndexValue, Read, Reduce, Select, Un
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
MAPPING = "contraction wgmma"
SIZES = {"M": 150, "N": 270, "K": 72}  # tails: 150 = 128 + 22 rows, 270 = 256 + 14 columns


@pytest.fixture(scope="module")
def residual_kernel():
    spec = EX / "gemm_residual.yaml"
    d = derive(load_spec_file(spec), str(spec), check=False)
    return lower(d.final, d.spec.name)


# ---------------------------------------------------------------- generated epilogues

ROW, COL = Aff.build({"ii": 1, "io": 128}), Aff.build({"ji": 1, "jo": 256})


def _reads() -> list[Read]:
    return [Read("bias", (COL,)), Read("bias", (Aff.build({"N": 1, "ji": -1, "jo": -256}, -1),)),
            Read("C0", (ROW, COL)), Read("C0", (COL, ROW))]


def random_tree(rnd: random.Random, acc: str, depth: int = 0):
    """An epilogue expression; every tree reads the accumulator at least once (the caller adds it)."""
    if depth >= 3 or rnd.random() < 0.25:
        pick = rnd.random()
        if pick < 0.4:
            return Read(acc, ())
        if pick < 0.75:
            return rnd.choice(_reads())
        if pick < 0.85:
            return IndexValue(rnd.choice([Aff.build({"ji": 1, "jo": 256}), Aff.build({"ii": 1}, -3)]))
        return Const(round(rnd.uniform(-2, 2), 3))
    kind = rnd.random()
    a = random_tree(rnd, acc, depth + 1)
    if kind < 0.55:
        b = random_tree(rnd, acc, depth + 1)
        op = rnd.choice(["+", "-", "*", "max", "/", "gt"])
        if op == "/":  # a denominator >= 1
            b = Bin("+", Const(1.0), Bin("*", b, b))
        if op == "gt":  # against a leaf: fp32 and float64 agree on which side a value lies
            b = random_tree(rnd, acc, 3)
        return Bin(op, a, b)
    fn = rnd.choice(["neg", "tanh", "exp", "sqrt", "rsqrt", "erf", "log"])
    if fn == "exp":
        a = Un("tanh", a)  # bounded argument
    if fn in ("sqrt", "rsqrt", "log"):
        a = Bin("+", Const(0.5), Bin("*", a, a))
    return Un(fn, a)


def eval_tree(e, env: dict, arrays: dict, acc: str, accv: float) -> float:
    """float64 meaning of an epilogue expression; reads outside a tensor are 0 (the zero fill)."""
    if isinstance(e, Const):
        return float(e.value)
    if isinstance(e, IndexValue):
        return float(e.aff.evaluate(env))
    if isinstance(e, Read):
        if e.tensor == acc:
            return accv
        arr = arrays[e.tensor]
        idx = tuple(a.evaluate(env) for a in e.idx)
        if any(i < 0 or i >= n for i, n in zip(idx, arr.shape)):
            return 0.0
        return float(arr[idx])
    if isinstance(e, Bin):
        a, b = eval_tree(e.a, env, arrays, acc, accv), eval_tree(e.b, env, arrays, acc, accv)
        ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
               "max": lambda: max(a, b), "gt": lambda: 1.0 if a > b else 0.0}
        return ops[e.op]()
    a = eval_tree(e.a, env, arrays, acc, accv)
    fns = {"neg": lambda x: -x, "tanh": math.tanh, "exp": math.exp, "sqrt": math.sqrt,
           "rsqrt": lambda x: 1 / math.sqrt(x), "erf": math.erf, "log": math.log}
    return fns[e.op](a)


HARNESS = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
static int g_bad = 0;
struct Arr { const float* d; long n; float operator[](long i) const {
    if (i < 0 || i >= n) { ++g_bad; return 0.0f; } return d[i]; } };
static inline float f16_to_f32(float x) { return x; }
static inline float derivc_tanh_approx(float x) { return std::tanh(x); }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline float host_expf(float x) { return std::exp(x); }
#define __expf host_expf
"""


def host_check(kernel, trees: list, seed: int = 0) -> list[str]:
    """Print each tree through the contraction matcher, run it on the host, compare; the problems."""
    if shutil.which("g++") is None:
        pytest.skip("no host C++ compiler")
    import tempfile

    acc = kernel.body[0].state[0].name
    rnd = np.random.default_rng(seed)
    M, N = SIZES["M"], SIZES["N"]
    arrays = {"bias": rnd.standard_normal(N), "C0": rnd.standard_normal((M, N))}
    src = [HARNESS]
    plans = []
    for f, t in enumerate(trees):
        plan = match(replace(kernel, store=replace(kernel.store, value=t)), MAPPING).epilogue
        plans.append(plan)
        assert set(plan.helpers) <= {"tanh_approx"}  # instruction wrappers: the harness has them
        src.append(
            f"static float epi_{f}(float acc_, int er_, int ec_, int tm, int tn, int sz_M, int sz_N, int sz_K,\n"
            f"    Arr p_e_bias, Arr p_e_C0, bool epi_interior) {{ (void)er_; (void)ec_; (void)tm; (void)tn;\n"
            f"    (void)sz_M; (void)sz_N; (void)sz_K; (void)p_e_bias; (void)p_e_C0; (void)epi_interior;\n"
            f"    {plan.body} }}\n"
            f"static bool interior_{f}(int tm, int tn, int sz_M, int sz_N, int sz_K) {{\n"
            f"    (void)tm; (void)tn; (void)sz_M; (void)sz_N; (void)sz_K; return {plan.interior}; }}\n")
    samples = []
    for f in range(len(trees)):
        for tm, tn in ((0, 0), (1, 0), (0, 1), (1, 1)):
            lanes = [(0, 0), (127, 255), (0, 255), (127, 0)] + [(int(rnd.integers(128)), int(rnd.integers(256)))
                                                                for _ in range(12)]
            for er, ec in lanes:
                samples.append((f, tm, tn, er, ec, float(rnd.standard_normal() * 2)))
    calls = "\n".join(
        f"        case {f}: {{ bool in_ = interior_{f}(tm, tn, M, N, K); int b0 = g_bad;\n"
        f"            float v = epi_{f}(acc, er, ec, tm, tn, M, N, K, bias, C0, in_);\n"
        f"            printf(\"%.9g %d %d\\n\", v, (int)in_, g_bad - b0); break; }}" for f in range(len(trees)))
    src.append(f"""
int main() {{
    const int M = {M}, N = {N}, K = {SIZES['K']};
    static float bd[{N}], cd[{M * N}];
    FILE* fp = fopen("data.bin", "rb");
    if (fread(bd, 4, {N}, fp) != {N} || fread(cd, 4, {M * N}, fp) != {M * N}) return 2;
    Arr bias{{bd, {N}}}, C0{{cd, {M * N}}};
    int f, tm, tn, er, ec; float acc;
    while (fscanf(stdin, "%d %d %d %d %d %f", &f, &tm, &tn, &er, &ec, &acc) == 6) {{
        switch (f) {{
{calls}
        }}
    }}
    return 0;
}}
""")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "h.cpp").write_text("\n".join(src))
        (tmp / "data.bin").write_bytes(arrays["bias"].astype(np.float32).tobytes()
                                       + arrays["C0"].astype(np.float32).tobytes())
        cc = subprocess.run(["g++", "-O1", "-std=c++17", "-o", str(tmp / "h"), str(tmp / "h.cpp")],
                            capture_output=True, text=True)
        assert cc.returncode == 0, cc.stderr[:3000]
        inp = "\n".join(f"{f} {tm} {tn} {er} {ec} {struct.unpack('f', struct.pack('f', a))[0]!r}"
                        for f, tm, tn, er, ec, a in samples)
        run = subprocess.run([str(tmp / "h")], input=inp, capture_output=True, text=True, cwd=tmp)
        assert run.returncode == 0, run.stderr
    f32 = {k: v.astype(np.float32).astype(np.float64) for k, v in arrays.items()}
    problems = []
    for (f, tm, tn, er, ec, a), line in zip(samples, run.stdout.splitlines()):
        got, _, bad = line.split()  # reads out of bounds: with the interior predicate, none are guarded
        env = {"ii": er, "ji": ec, "io": tm, "jo": tn, **SIZES}
        a32 = struct.unpack("f", struct.pack("f", a))[0]
        want = eval_tree(trees[f], env, f32, acc, a32)
        got = float(got)
        if int(bad):
            problems.append(f"tree {f} at block ({tm}, {tn}) lane ({er}, {ec}): {bad} reads out of bounds")
        if not abs(got - want) <= 1e-4 * (1 + abs(want)):
            problems.append(f"tree {f} ({plans[f].source}) at block ({tm}, {tn}) lane ({er}, {ec}): "
                            f"{got} != {want}")
    return problems


def _trees(n: int, seed: int, acc: str) -> list:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        t = random_tree(rnd, acc)
        out.append(Bin(rnd.choice(["+", "*", "max"]), Read(acc, ()), t))
    return out


def test_generated_epilogues_print_their_meaning(residual_kernel):
    acc = residual_kernel.body[0].state[0].name
    trees = _trees(40, 7, acc) + [residual_kernel.store.value]
    assert host_check(residual_kernel, trees) == []


def test_interior_predicate_only_where_every_read_fits(residual_kernel):
    acc = residual_kernel.body[0].state[0].name
    plan = match(residual_kernel, MAPPING).epilogue
    assert plan.interior == "((sz_N - 255 - 256 * tn) > 0) && ((sz_M - 127 - 128 * tm) > 0)"
    # bias[N - 1 - j] needs a lower bound; its interior test is the upper corner of the box
    low = Read("bias", (Aff.build({"N": 1, "ji": -1, "jo": -256}, -1),))
    p2 = match(replace(residual_kernel, store=replace(residual_kernel.store, value=Bin("+", Read(acc, ()), low))),
               MAPPING).epilogue
    assert "(0) <= " in p2.body and "epi_interior ||" in p2.body
    assert host_check(residual_kernel, [Bin("+", Read(acc, ()), low)]) == []


# ---------------------------------------------------------------- mutations of the printer


def _mutated(monkeypatch, residual_kernel, patch) -> list[str]:
    acc = residual_kernel.body[0].state[0].name
    orig = epi_mod._Printer.read

    def read(self, r, guarded):
        return patch(self, r, guarded, orig)

    monkeypatch.setattr(epi_mod._Printer, "read", read)
    return host_check(residual_kernel, [residual_kernel.store.value] + _trees(6, 3, acc))


def test_mutation_dropped_bias_is_caught(monkeypatch, residual_kernel):
    problems = _mutated(monkeypatch, residual_kernel,
                        lambda self, r, g, orig: "0.0f" if r.tensor == "bias" else orig(self, r, g))
    assert any("!=" in p for p in problems)


def test_mutation_bias_read_at_the_row_is_caught(monkeypatch, residual_kernel):
    def at_row(self, r, g, orig):
        if r.tensor == "bias":
            r = Read("bias", tuple(a.subst("ji", Aff.of("ii")).subst("jo", Aff.of("io")) for a in r.idx))
        return orig(self, r, g)

    assert any("!=" in p for p in _mutated(monkeypatch, residual_kernel, at_row))


def test_mutation_dropped_guard_is_caught(monkeypatch, residual_kernel):
    problems = _mutated(monkeypatch, residual_kernel, lambda self, r, g, orig: orig(self, r, False))
    assert any("out of bounds" in p for p in problems)


def test_mutation_interior_everywhere_is_caught(monkeypatch, residual_kernel):
    monkeypatch.setattr(epi_mod, "box_extremes", lambda c, box, names: ("(true)", "(false)"))
    acc = residual_kernel.body[0].state[0].name
    problems = host_check(residual_kernel, [residual_kernel.store.value] + _trees(4, 5, acc))
    assert any("out of bounds" in p for p in problems)


# ---------------------------------------------------------------- refusals


def _refusal(kernel, value) -> str:
    with pytest.raises(UnsupportedMapping) as exc:
        match(replace(kernel, store=replace(kernel.store, value=value)), MAPPING)
    return str(exc.value)


def test_unprintable_epilogues_are_refused_by_name(residual_kernel):
    k = residual_kernel
    acc = Read(k.body[0].state[0].name, ())
    red = k.body[0].state[0].update.b
    assert isinstance(red, Reduce)
    cases = [
        (Select((Cond(Aff.of("ii"), "<", Aff.of("ji")),), acc, Const(0.0)), "Select"),
        (Bin("+", acc, red), "Reduce"),
        (Bin("rescale", acc, Const(1.0)), "'rescale'"),
        (Bin("+", acc, Const(float("inf"))), "not a finite number"),
        (Bin("+", acc, Read("bias", (Aff.of("ko"),))), "ko"),
        (Bin("+", acc, Read("A_s", (Aff.of("ii"), Aff.of("ji")))), "A_s"),
        (Bin("+", acc, Read("sum_other", ())), "sum_other"),
        (Un("sin", acc), "'sin'"),  # not a function of the language
        (Read("bias", (COL,)), "does not use the accumulator"),
    ]
    for value, name in cases:
        msg = _refusal(k, value)
        assert "epilogue" in msg or "accumulator" in msg, msg
        assert name in msg, (name, msg)


def test_a_mask_in_the_store_stops_the_build(tmp_path):
    from compiler.cli import BuildError, build_to

    text = (EX / "gemm_bias_relu.yaml").read_text().replace(
        'max(sum(k: A[i, k] * B[k, j]) + bias[j], 0)', 'where(i < j, sum(k: A[i, k] * B[k, j]) + bias[j], 0)')
    path = tmp_path / "masked.yaml"
    path.write_text(text)
    with pytest.raises(BuildError, match="epilogue contains Select"):
        build_to(path, tmp_path / "out", seed=0, proofs=False)


# ---------------------------------------------------------------- builds (NVRTC + SASS)


def _build(path: Path, out: Path):
    import json

    from compiler.cli import build_to

    build_to(path, out, seed=0, proofs=False)
    return json.loads((out / "plan.json").read_text())


@pytest.mark.parametrize("name,reads", [("gemm_bias_relu", ["bias"]), ("gemm_bias_gelu", ["bias"]),
                                        ("gemm_residual", ["bias", "C0"])])
def test_examples_build_with_their_epilogue(name, reads, example_build):
    import json

    from codegen.cuda.nvrtc import nvrtc_available

    b = example_build(EX / f"{name}.yaml")  # the run's shared build (seed 0)
    assert b.rc == 0, b.stderr
    plan = json.loads((b.out / "plan.json").read_text())
    epi = plan["plan"]["epilogue"]
    assert plan["mapping"] == "contraction_wgmma" and [t["name"] for t in epi["tensors"]] == reads
    src = (b.out / "kernel_tma.cu").read_text()
    assert "auto epi = " in src and "epi(acc[mi][4 * j]" in src
    for r in reads:
        assert f"p_e_{r}" in src.split(f"derivc_{name}(const")[1].split(")")[0]  # a kernel parameter
    if name == "gemm_bias_gelu":
        assert "derivc_tanh_approx(" in src and "tanh.approx.f32" in src
    if not nvrtc_available():
        pytest.skip("NVRTC not installed")
    for stem in ("sass", "kernel_tma.sass"):
        sass = json.loads((b.out / f"{stem}.json").read_text())
        assert sass["violations"] == [] and sass["hgmma"] and sass["local_memory_ops"] == 0


def test_mma_sync_mapping_prints_the_epilogue(tmp_path):
    import json

    from codegen.cuda.nvrtc import nvrtc_available

    text = (EX / "gemm.yaml").read_text()
    text = text.replace("C[i, j] = sum(k: A[i, k] * B[k, j])",
                        "C[i, j] = max(sum(k: A[i, k] * B[k, j]) + bias[j], 0) - 0.5 * C0[i, j]")
    text = text.replace("  B: {shape: [K, N], dtype: f16}\n",
                        "  B: {shape: [K, N], dtype: f16}\n  bias: {shape: [N], dtype: f16}\n"
                        "  C0: {shape: [M, N], dtype: f16}\n")
    path = tmp_path / "gemm_epi_mma.yaml"
    path.write_text(text)
    plan = _build(path, tmp_path / "out")
    assert plan["mapping"] == "contraction_mma_sync" and plan["plan"]["args"] == ["A", "B", "bias", "C0", "C"]
    src = (tmp_path / "out" / "kernel.cu").read_text()
    assert src.count("epi(acc[mi][ni][") == 16  # four values, vector and scalar stores, interior and tail
    if nvrtc_available():
        sass = json.loads((tmp_path / "out" / "sass.json").read_text())
        assert sass["violations"] == [] and sass["hmma"] and sass["local_memory_ops"] == 0


def test_kernel_arguments_follow_the_kernel_ir(tmp_path):
    """A spec declaring B before A: the kernel takes B's pointer first, as the runtime passes it."""
    text = (EX / "gemm_bias_relu.yaml").read_text().replace(
        "  A: {shape: [M, K], dtype: f16}\n  B: {shape: [K, N], dtype: f16}\n",
        "  B: {shape: [K, N], dtype: f16}\n  A: {shape: [M, K], dtype: f16}\n")
    path = tmp_path / "swapped.yaml"
    path.write_text(text)
    plan = _build(path, tmp_path / "out")
    assert plan["plan"]["args"] == ["B", "A", "bias", "C"]
    head = (tmp_path / "out" / "kernel.cu").read_text().split("derivc_gemm_bias_relu(const")[1].split(")")[0]
    assert head.index("p_b") < head.index("p_a") < head.index("p_e_bias") < head.index("p_c")


# ---------------------------------------------------------------- FUSE into a binding (fuse_let)


GELU_SPEC = (EX / "gemm_bias_gelu.yaml")


def _fuse_only(tmp_path, statements: list[str], step: str) -> Path:
    text = GELU_SPEC.read_text()
    head, sched = text.split("schedule:")
    import re

    head = re.sub(r"statements:\n(  - .*\n)+", "statements:\n" + "".join(f'  - "{s}"\n' for s in statements), head)
    path = tmp_path / "fuse.yaml"
    path.write_text(head + "schedule:\n  - " + step + "\n")
    return path


@pytest.mark.parametrize("statements,step,code,reason", [
    (["X[i, j] = sum(k: A[i, k] * B[k, j]) + bias[j]", "C[i, j] = X[i, j] * X[i, 0]"],
     "{rule: fuse_let, producer: X, def: C, name: x}", 3, "different indices"),
    (["X[i, j] = sum(k: A[i, k] * B[k, j]) + bias[j]", "C[i, j] = X[i, j] + bias[j]"],
     "{rule: fuse_let, producer: X, def: C, name: bias}", 2, "already used"),
])
def test_epilogue_binding_preconditions(tmp_path, capsys, statements, step, code, reason):
    """An epilogue reading the pre-activation at two points (a refused precondition, exit 3), a
    binding named like an input (a name clash, exit 2): one line with the reason (fuse_let's
    own tests are in test_rowwise.py)."""
    from compiler.cli import main as cli_main

    path = _fuse_only(tmp_path, statements, step)
    assert cli_main(["--plain", "build", str(path), "-o", str(tmp_path / "o"), "--no-codegen"]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and reason in err[0] and "fuse_let" in err[0]
    assert not (tmp_path / "o").exists()


def test_function_instructions_follow_the_output_dtype(residual_kernel):
    """f16 output: tanh.approx / __expf (below the output's rounding); f32 output: tanhf / expf."""
    acc = Read(residual_kernel.body[0].state[0].name, ())
    value = Bin("+", Un("tanh", acc), Un("exp", Un("neg", acc)))
    k16 = replace(residual_kernel, store=replace(residual_kernel.store, value=value))
    fast = match(k16, MAPPING).epilogue
    assert "derivc_tanh_approx(" in fast.body and "__expf(" in fast.body and fast.helpers == ("tanh_approx",)
    out32 = replace(residual_kernel.output, dtype="f32")
    k32 = replace(k16, tensors=tuple(out32 if t.output else t for t in k16.tensors))
    exact = match(k32, MAPPING).epilogue
    assert "tanhf(" in exact.body and "expf(" in exact.body and "__expf" not in exact.body
    assert not exact.helpers


def test_a_read_used_twice_is_one_local_and_a_read_used_once_stays_in_place(residual_kernel):
    """bias read twice: one local (the compiler does not merge the guarded loads); C0 read once:
    printed in place (a local there made the residual kernel 20 % slower on the H200, run E)."""
    acc = Read(residual_kernel.body[0].state[0].name, ())
    bias, c0 = Read("bias", (COL,)), Read("C0", (ROW, COL))
    value = Bin("+", Bin("*", Bin("+", acc, bias), bias), c0)
    k = replace(residual_kernel, store=replace(residual_kernel.store, value=value))
    body = match(k, MAPPING).epilogue.body
    assert body.count("p_e_bias[") == 1 and body.count("p_e_C0[") == 1
    assert body.count("const float ") == 1 and "const float e0_ = ((epi_interior" in body
    assert "return (((acc_ + e0_) * e0_) + ((epi_interior" in body
    assert host_check(k, [value]) == []


def test_mutation_gt_printed_as_ge_is_caught(monkeypatch, residual_kernel):
    """The ReLU backward's step gt(C0[j, i], 0): where the read is outside C0 it is the fill 0, a
    tie that `>=` gets wrong."""
    acc = residual_kernel.body[0].state[0].name
    relu_bwd = Bin("*", Read(acc, ()), Bin("gt", Read("C0", (COL, ROW)), Const(0.0)))
    assert host_check(residual_kernel, [relu_bwd]) == []
    monkeypatch.setattr(epi_mod, "gt_c", lambda a, b: f"(({a}) >= ({b}) ? 1.0f : 0.0f)")
    assert any("!=" in p for p in host_check(residual_kernel, [relu_bwd]))
