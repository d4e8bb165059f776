"""Schedule variants (`variants:`), their build, the tuning table and its shape dispatch (CPU)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from compiler.cli import build_to, main
from compiler.errors import SpecError
from compiler.outdir import BUILD_MARKER, write_marker
from compiler.schedule_variants import MAX_VARIANTS, expand, resolve
from compiler.spec import parse_spec_text
from compiler.tuning_table import TUNING_FILE, bucket, read_tuning
from compiler.variant_build import built_dirs, read_variants

ROOT = Path(__file__).resolve().parent.parent
TUNED = (ROOT / "examples" / "gemm_wgmma_tuned.yaml").read_text()


def _spec(variants: str, text: str = TUNED) -> str:
    return "\n".join(("variants: " + variants) if line.startswith("variants:") else line for line in text.splitlines())


def test_expand_is_the_product_default_first():
    vs = expand(parse_spec_text(TUNED))
    assert len(vs) == 8
    assert vs[0].as_dict() == {"tile_i": 128, "tile_j": 256, "warps": 8}
    assert len({v.name for v in vs}) == 8
    for v in vs:
        assert not v.spec.variants
        sizes = [s.params()["size"] for s in v.spec.schedule if s.rule == "tile" and s.params()["index"] in ("i", "j")]
        assert sizes == [v.as_dict()["tile_i"], v.as_dict()["tile_j"]]


def test_resolve_writes_the_choice_and_refuses_others():
    spec = parse_spec_text(TUNED)
    r = resolve(spec, {"tile_i": 64, "tile_j": 128, "warps": 4})
    counts = [s.params()["count"] for s in r.schedule if s.rule == "parallel" and s.params()["to"] == "warp"]
    assert counts == [4]
    with pytest.raises(SpecError, match="not one of"):
        resolve(spec, {"tile_i": 32, "tile_j": 128, "warps": 4})
    with pytest.raises(SpecError, match="exactly"):
        resolve(spec, {"tile_i": 64})


@pytest.mark.parametrize("variants, schedule_edit, match", [
    ("{tile_i: [128], tile_j: [256]}", None, r"\$warps is not declared"),
    ("{tile_i: [128], tile_j: [256], warps: [8], extra: [1, 2]}", None, "extra: not used"),
    ("{tile_i: [128, 128], tile_j: [256], warps: [8]}", None, "lists a value twice"),
    ("{tile_i: [128], tile_j: [256], warps: ['8 warps']}", None, "plain identifier"),
    ("{tile_i: [], tile_j: [256], warps: [8]}", None, "lists no value"),
])
def test_bad_variants_are_one_clear_error(variants, schedule_edit, match):
    with pytest.raises(SpecError, match=match):
        expand(parse_spec_text(_spec(variants)))


def test_too_many_variants_are_refused():
    values = ", ".join(str(16 * (k + 1)) for k in range(MAX_VARIANTS + 1))
    with pytest.raises(SpecError, match="combinations"):
        expand(parse_spec_text(_spec(f"{{tile_i: [{values}], tile_j: [256], warps: [8]}}")))


def test_placeholders_in_a_gradient_schedule_are_refused():
    forward, grad = (ROOT / "examples" / "gemm_grad.yaml").read_text().split("\ngrad:")
    assert "size: 128" in grad
    text = forward + "\nvariants: {t: [128, 64]}\ngrad:" + grad.replace("size: 128", "size: $t", 1)
    with pytest.raises(SpecError, match="forward schedule only"):
        expand(parse_spec_text(text))


@pytest.fixture(scope="module")
def tuned_build(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("spec") / "gemm_tuned.yaml"
    # 64 rows over 8 warps has no wgmma form, 128 x 256 over 4 warps spills: two are refused
    src.write_text(_spec("{tile_i: [128, 64], tile_j: [256], warps: [8, 4]}"))
    out = tmp_path_factory.mktemp("build") / "out"
    build_to(src, out, proofs=False, seed=5)
    return out


def test_build_writes_every_legal_variant_and_lists_the_refused(tuned_build):
    table = read_variants(tuned_build)
    rows = {r["name"]: r for r in table["variants"]}
    assert table["default"] == "tile_i-128_tile_j-256_warps-8" and rows[table["default"]]["dir"] == "."
    refused = rows["tile_i-64_tile_j-256_warps-8"]
    assert refused["status"] == "refused" and "block_m=64" in refused["reason"]
    assert not (tuned_build / "variants" / "tile_i-64_tile_j-256_warps-8").exists()
    built = built_dirs(tuned_build)
    assert set(built) == {"tile_i-128_tile_j-256_warps-8", "tile_i-64_tile_j-256_warps-4"}
    # 128 x 256 accumulators over 4 warps spill: the register-resident promise refuses it
    assert "local memory" in rows["tile_i-128_tile_j-256_warps-4"]["reason"]
    assert not refused["reason"].startswith(str(tuned_build.parent))
    for name, d in built.items():
        trace = json.loads((d / "derivation.json").read_text())
        assert trace["variant"] == rows[name]["choice"]
        assert trace["spec_text"] is not None and trace["seed"] == 5
        assert (d / BUILD_MARKER).exists() and (d / "kernel.cu").exists()


def test_each_variant_replays_to_its_own_kernel(tuned_build):
    from codegen.build_dir import load_build

    texts = {}
    for name, d in built_dirs(tuned_build).items():
        loaded = load_build(d)  # re-derives from derivation.json and compares the sources
        texts[name] = loaded.printed.variants[0].source.source
        assert loaded.printed.kernel.dynamic() == ("M", "N", "K")
    assert len(set(texts.values())) == len(texts)


def _tune_table(build: Path, winner: str, loser: str) -> dict:
    sizes = {"M": 128, "N": 4096, "K": 4096}
    return {"dynamic": ["M", "N", "K"], "device": "test",
            "buckets": {bucket(sizes, ("M", "N", "K")): {"sizes": sizes, "variant": winner,
                                                        "ms": {winner: 0.01, loser: 0.02}}}}


def _with_table(src: Path, dst: Path, table: dict) -> Path:
    shutil.copytree(src, dst)
    (dst / TUNING_FILE).write_text(json.dumps(table))
    write_marker(dst, BUILD_MARKER)
    return dst


def _rebuild_once(monkeypatch, tmp_path: Path) -> dict[bytes, Path]:
    """compiler.verify.rebuild run for real once per recorded derivation, its result copied for the
    others: the builds below differ only in tuning.json, which a rebuild never reads (verify judges
    the table after, against the rebuild).  Returns the real rebuilds (a recorded derivation: a copy)."""
    import shutil

    from compiler import verify

    real, done = verify.rebuild, {}

    def rebuild(build: Path, into: Path) -> None:
        key = (build / "derivation.json").read_bytes()
        if key not in done:
            real(build, into)
            done[key] = tmp_path / f"rebuilt-{len(done)}"
            shutil.copytree(into, done[key])
        else:
            shutil.copytree(done[key], into, dirs_exist_ok=True)

    monkeypatch.setattr(verify, "rebuild", rebuild)
    return done


def test_verify_accepts_a_consistent_table_and_catches_a_bad_one(tuned_build, tmp_path, monkeypatch):
    from compiler.verify import check_files

    rebuilt = _rebuild_once(monkeypatch, tmp_path)
    fast, default = "tile_i-64_tile_j-256_warps-4", "tile_i-128_tile_j-256_warps-8"
    good = _with_table(tuned_build, tmp_path / "good", _tune_table(tuned_build, fast, default))
    mismatches, same = check_files(good)
    assert mismatches == [] and same > 10
    bad = _tune_table(tuned_build, "tile_i-64_tile_j-256_warps-8", default)  # a refused variant
    mismatches, _ = check_files(_with_table(tuned_build, tmp_path / "bad", bad))
    assert [m.path for m in mismatches] == [TUNING_FILE] and "not a variant this build built" in mismatches[0].detail
    slow = _tune_table(tuned_build, fast, default)
    row = next(iter(slow["buckets"].values()))
    row["ms"][fast] = 0.5  # the recorded winner is not the fastest of its row
    mismatches, _ = check_files(_with_table(tuned_build, tmp_path / "slow", slow))
    assert mismatches and "not the fastest" in mismatches[0].detail
    assert len(rebuilt) == 1


def test_dispatch_picks_the_recorded_variant_per_bucket(tuned_build, tmp_path):
    from codegen.tuned import Dispatch

    fast, default = "tile_i-64_tile_j-256_warps-4", "tile_i-128_tile_j-256_warps-8"
    d = _with_table(tuned_build, tmp_path / "t", _tune_table(tuned_build, fast, default))
    dispatch = Dispatch(d, ("M", "N", "K"))
    assert dispatch.tuned
    assert dispatch.variant({"M": 128, "N": 4096, "K": 4096}) == fast
    assert dispatch.variant({"M": 100, "N": 2049, "K": 2049}) == fast  # same magnitudes, same bucket
    assert dispatch.variant({"M": 8192, "N": 8192, "K": 8192}) == default  # never measured: the default
    assert not Dispatch(tuned_build, ("M", "N", "K")).tuned
    with pytest.raises(ValueError, match="dynamic sizes"):
        Dispatch(d, ("M", "N"))


def test_read_tuning_rejects_a_row_in_the_wrong_bucket(tuned_build, tmp_path):
    fast, default = "tile_i-64_tile_j-256_warps-4", "tile_i-128_tile_j-256_warps-8"
    table = _tune_table(tuned_build, fast, default)
    table["buckets"] = {"M:1,N:1,K:1": next(iter(table["buckets"].values()))}
    d = _with_table(tuned_build, tmp_path / "w", table)
    with pytest.raises(ValueError, match="fall in"):
        read_tuning(d, set(built_dirs(d)))


def test_tune_without_a_gpu_is_unavailable(tuned_build, capsys):
    rc = main(["tune", str(tuned_build), "--sizes", "M=128,N=4096,K=4096"])
    assert rc == 1 and "not available" in capsys.readouterr().err
