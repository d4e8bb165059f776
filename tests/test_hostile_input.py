"""Hostile input (issue 20): alias bombs, merge keys, bytes that are not UTF-8 text, huge
statements and values.  Each is exit 2 with ONE bounded line naming the file and where, fast,
never a traceback."""
from __future__ import annotations

import time

import pytest
from derivc_testing import GOOD_GEMM, assert_fails
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.errors import MAX_MESSAGE

NAME = "bad.yaml"


def bounded(msg: str) -> str:
    """The line holds the file name, and at most MAX_MESSAGE characters besides."""
    assert msg.startswith("derivc: error: ") and f"{NAME}: " in msg, msg[:400]
    after_file = msg.split(f"{NAME}: ", 1)[1]
    assert len(after_file) <= MAX_MESSAGE, (len(after_file), msg[:400])
    return msg


def fails_fast(text: str | bytes, *fragments: str, seconds: float = 1.0) -> str:
    """assert_fails with exit 2, within `seconds` of CPU time (a hang or an expansion is CPU
    bound; the CPU time does not grow with the load of a shared test machine)."""
    start = time.process_time()
    msg = assert_fails(text, 2, *fragments, name=NAME)
    took = time.process_time() - start
    assert took < seconds, f"took {took:.2f} s: {msg[:200]}"
    return bounded(msg)


def outcome(data: str | bytes) -> tuple[int, str]:
    """Build `data` in-process: (exit code, the error line, checked bounded; '' on success)."""
    import tempfile
    from pathlib import Path

    from derivc_testing import run_cli

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / NAME
        spec.write_bytes(data if isinstance(data, bytes) else data.encode())
        start = time.process_time()
        rc, _, err = run_cli(["build", str(spec), "-o", str(Path(tmp) / "out"), "--no-codegen", "--no-proofs"])
        assert rc == 0 or time.process_time() - start < 2.0  # refused at once; a build may take longer
    assert "Traceback" not in err and "internal error" not in err, err[:400]
    if rc == 0:
        return rc, ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err[:400]
    return rc, bounded(lines[0])


def laughs(levels: int = 9, width: int = 9) -> list[str]:
    """Anchors a0..a{levels-1}, each a list of `width` aliases of the one before: 9^9 values."""
    out = [f"&a0 [{', '.join(['1'] * width)}]"]
    out += [f"&a{k} [{', '.join([f'*a{k - 1}'] * width)}]" for k in range(1, levels)]
    return out


# --------------------------------------------------------------------------- 1. anchors / aliases


def test_alias_bomb_in_sizes_is_refused_before_expansion():
    """Before: sizes.M's error printed the expanded 9^9 list (a hang)."""
    anchors = "".join(f"x{k}: {v}\n" for k, v in enumerate(laughs()))
    text = anchors + GOOD_GEMM.replace("{M: dynamic,", "{M: *a8,")
    fails_fast(text, "line 6", "more than 100000 values", "alias *a4", "alias bomb")


def test_alias_bomb_in_check_sizes_is_refused_before_expansion():
    anchors = "".join(f"x{k}: {v}\n" for k, v in enumerate(laughs()))
    fails_fast(anchors + GOOD_GEMM + "check_sizes: {M: *a8}\n", "more than 100000 values", "alias bomb")


def test_alias_bomb_inside_sizes_is_refused_before_expansion():
    bomb = ", ".join(f"Z{k}: {v}" for k, v in enumerate(laughs()))
    fails_fast(GOOD_GEMM.replace("{M: dynamic,", f"{{{bomb}, M: *a8,"), "line 2", "alias bomb")


def test_recursive_alias_is_refused():
    fails_fast(GOOD_GEMM + "description: &d [1, *d]\n", "line 9", "recursive alias")


def test_alias_deeper_than_the_nesting_limit_is_refused():
    deep = "[" * 20 + "1" + "]" * 20
    text = f"x: &deep {deep}\n" + GOOD_GEMM + "check_sizes: {M: " + "[" * 15 + "*deep" + "]" * 15 + "}\n"
    fails_fast(text, "nested deeper than 32 levels", "alias *deep")


def test_shared_values_yaml_safe_dump_writes_are_read(tmp_path):
    """yaml.safe_dump writes a value two fields share once, as &id001 / *id001: such a file builds."""
    import yaml

    shape = ["M", "N"]
    doc = {"name": "add", "sizes": {"M": "dynamic", "N": "dynamic"},
           "inputs": {"A": {"shape": shape, "dtype": "f32"}, "B": {"shape": shape, "dtype": "f32"}},
           "statements": ["C[i, j] = A[i, j] + B[i, j]"], "output": {"tensor": "C", "dtype": "f32"}}
    text = yaml.safe_dump(doc, sort_keys=False)
    assert "&id001" in text and "*id001" in text
    assert outcome(text) == (0, "")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(levels=st.integers(1, 12), width=st.integers(1, 12), where=st.sampled_from(["sizes", "check_sizes", "top"]))
def test_any_alias_bomb_is_refused_fast(levels, width, where):
    """Lists in sizes / check_sizes or unknown fields are refused anyway; a large expansion is
    refused as such, before anything is built from it, and within two seconds."""
    anchors = laughs(levels, width)
    last = f"*a{levels - 1}"
    if where == "top":
        text = "".join(f"x{k}: {v}\n" for k, v in enumerate(anchors)) + GOOD_GEMM + f"check_sizes: {{M: {last}}}\n"
    elif where == "sizes":
        text = GOOD_GEMM.replace("{M: dynamic,", "{" + ", ".join(f"Z{k}: {v}" for k, v in enumerate(anchors)) + ", M: dynamic,")
    else:
        text = GOOD_GEMM + "check_sizes: {" + ", ".join(f"Z{k}: {v}" for k, v in enumerate(anchors)) + "}\n"
    expanded = sum(width ** k for k in range(1, levels + 1))
    fails_fast(text, *(["alias bomb"] if expanded > 200_000 else []), seconds=2.0)


# --------------------------------------------------------------------------- 2. merge keys


def test_merge_key_is_unsupported_not_malformed():
    text = GOOD_GEMM.replace("  B: {shape: [K, N], dtype: f16}", "  B:\n    <<: {shape: [K, N]}\n    dtype: f16")
    msg = fails_fast(text, "line 6", "merge keys (<<:) are not supported")
    assert "malformed" not in msg


def test_merge_key_in_flow_mapping_is_unsupported():
    fails_fast(GOOD_GEMM.replace("{M: dynamic,", "{<<: {Q: 1}, M: dynamic,"), "line 2", "merge keys")


# --------------------------------------------------------------------------- 3. bytes that are not text


def test_latin1_file_is_not_utf8():
    data = GOOD_GEMM.replace("name: gemm", "name: gemm\ndescription: café").encode("latin-1")
    at = data.index("é".encode("latin-1"))
    fails_fast(data, "line 2", f"not UTF-8 text at byte {at}")


def test_nul_byte_is_a_binary_file():
    data = GOOD_GEMM.encode() + b"\x00\x01\x02"
    fails_fast(data, "line 9", f"NUL byte at byte {len(GOOD_GEMM)}")


def test_control_character_is_named_with_its_line():
    data = GOOD_GEMM.encode().replace(b"name: gemm", b"name: gemm\x07")
    fails_fast(data, "line 1", "'\\x07'", "not allowed")


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    from derivc_testing import run_cli

    f = tmp_path / "g.yaml"
    f.write_bytes(b"\xef\xbb\xbf" + GOOD_GEMM.encode())
    rc, _, err = run_cli(["build", str(f), "-o", str(tmp_path / "out"), "--no-codegen", "--no-proofs"])
    assert rc == 0, err


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=1, max_size=4000))
def test_random_bytes_are_one_bounded_input_error(data):
    """Junk is invalid input: exit 2 and one bounded line, never a traceback (assert_fails)."""
    fails_fast(data, seconds=2.0)


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=1, max_size=200), st.integers(0, len(GOOD_GEMM)))
def test_junk_inside_a_good_file_is_one_bounded_input_error(junk, at):
    data = GOOD_GEMM.encode()[:at] + junk + GOOD_GEMM.encode()[at:]
    rc, _ = outcome(data)  # junk may leave a valid spec (a comment, a description): exit 0
    assert rc in (0, 2) and (rc == 2 or (b"\x00" not in junk and b"\xff" not in junk))


# --------------------------------------------------------------------------- 5. bounded error lines


def test_100kb_statement_error_is_short_and_reason_first():
    terms = " + ".join(["A[i, k] * B[k, j]"] * 6000)
    text = GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", f"sum(k: {terms})")
    assert len(text) > 100_000
    msg = fails_fast(text, "statements[0]", "cannot parse: statement longer than 4000 characters")
    assert msg.index("longer than") < msg.index("A[i, k]")  # the reason before the statement


def test_statement_error_cut_around_its_column():
    terms = " + ".join(["A[i, k] * B[k, j]"] * 150)
    text = GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", f"sum(k: {terms} $ B[k, j])")
    col = text.split('"')[1].index("$") + 1
    msg = fails_fast(text, "statements[0]", f"unexpected character '$' at column {col}", "…", "⟦$⟧ B[k, j])")
    assert len(msg) < 300


def test_short_statement_is_shown_whole():
    text = GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", "sum(k: A[i, k] ** B[k, j])")
    fails_fast(text, "statements[0]", "cannot parse: expected a name, found '*' at column 27",
               '"C[i, j] = sum(k: A[i, k] ** B[k, j])"')


def test_huge_value_is_shown_bounded():
    text = GOOD_GEMM.replace("M: dynamic", "M: [" + ", ".join(["1"] * 5000) + "]")
    fails_fast(text, "sizes.M", "expected a positive integer or dynamic, got list [1, 1,")


def test_long_unknown_field_is_shown_bounded():
    fails_fast(GOOD_GEMM + "x" * 1000 + ": 1\n", "unknown field")


def test_line_breaks_in_a_statement_stay_on_one_line():
    text = GOOD_GEMM.replace("A[i, k] * B[k, j])", "A[i, k] \\u2028\\x1c\\x85 $ \\x1b[31m B[k, j])")
    fails_fast(text, "statements[0]", "unexpected character '$'", "\\u2028\\x1c\\x85 $ \\x1b[31m")


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=3000))
def test_any_statement_text_gives_a_bounded_line(junk):
    import json

    text = GOOD_GEMM.replace('"C[i, j] = sum(k: A[i, k] * B[k, j])"', json.dumps("C[i, j] = " + junk))
    rc, _ = outcome(text)  # junk that happens to be a statement builds, or fails its check (3)
    assert rc in (0, 2, 3)


# --------------------------------------------------------------------------- 4. bounded parameters


def tiled(size: int, index: str = "i", sizes: str = "", check: str = "") -> str:
    text = GOOD_GEMM.replace("{M: dynamic, N: dynamic, K: dynamic}", sizes or "{M: dynamic, N: dynamic, K: dynamic}")
    return text + check + f"schedule:\n  - {{rule: tile, def: C, index: {index}, size: {size}}}\n"


@pytest.mark.parametrize("index", ["i", "k"])
@pytest.mark.parametrize("size", [2**31 - 1, 2**31, 2**40])
def test_huge_tile_on_small_check_sizes_is_refused_by_the_padded_budget(size, index):
    """Before: the check interpreted ii < 2^31 (16 GiB) for an extent of 5, exit 1 MemoryError."""
    msg = fails_fast(tiled(size, index, check="check_sizes: {M: 5, N: 5, K: 5}\n"), "schedule[0]", "step 1 (tile)")
    assert "padded extents" in msg or "parameter size" in msg, msg


@pytest.mark.parametrize("size", [2**31 - 1, 2**31])
def test_huge_tile_on_a_dynamic_size_names_its_step(size):
    fails_fast(tiled(size), "schedule[0]", "step 1 (tile)", "numeric checks", "smaller tile")


def test_tile_longer_than_a_fixed_extent_is_an_input_error():
    """Before: exit 3, a failed derivation; the extent is known, so the input is wrong."""
    fails_fast(tiled(128, sizes="{M: 64, N: dynamic, K: dynamic}"), "schedule[0]", "step 1 (tile)",
               "parameter size", "tile size 128 exceeds the extent M = 64")


def test_tile_equal_to_a_fixed_extent_builds(tmp_path):
    rc, msg = outcome(tiled(64, sizes="{M: 64, N: dynamic, K: dynamic}"))
    assert rc == 0, msg


def test_tile_longer_than_small_check_sizes_builds():
    """A kernel meets inputs shorter than its tile: checking a tile of 64 at M = 5 is legitimate."""
    rc, msg = outcome(tiled(64, check="check_sizes: {M: 5}\n"))
    assert rc == 0, msg


@pytest.mark.parametrize("rule", ["split_kv", "split_k"])
def test_splits_are_bounded_by_the_grid(rule):
    from compiler.machine import DEVICE
    from compiler.rules import RULES

    p = RULES[rule].Params
    with pytest.raises(Exception, match="less than or equal"):
        p.model_validate({"def": "O", "index": "jo", "splits": 2**31})
    assert p.model_fields["splits"].metadata[0].le == min(DEVICE.grid_limits)


def test_huge_split_k_is_an_input_error_at_its_step():
    sched = "  - {rule: tile, def: C, index: k, size: 16}\n  - {rule: split_k, def: C, index: ko, splits: 4294967296}\n"
    fails_fast(GOOD_GEMM + "schedule:\n" + sched, "schedule[1]", "step 2 (split_k)", "splits")


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 48) | st.integers(2**27, 2**63), index=st.sampled_from(["i", "j", "k"]),
       check=st.sampled_from(["", "check_sizes: {M: 5, N: 7, K: 3}\n", "check_sizes: {M: 1000, N: 1000, K: 64}\n"]))
def test_any_tile_size_is_built_or_refused_in_one_line(size, index, check):
    """Small tiles build; from 2^27 on every tile is refused (by the padded budget or the bound)."""
    rc, _ = outcome(tiled(size, index, check=check))
    assert rc == (0 if size <= 48 else 2)


@settings(max_examples=25, deadline=None)
@given(value=st.integers(2**27, 2**64), field=st.sampled_from(["sizes", "check_sizes"]), name=st.sampled_from("MNK"))
def test_any_large_size_is_refused_in_one_line(value, field, name):
    """Fixed or check sizes from 2^27 on: too large, or over the check budget; never evaluated."""
    if field == "sizes":
        text = GOOD_GEMM.replace(f"{name}: dynamic", f"{name}: {value}")
    else:
        text = GOOD_GEMM + f"check_sizes: {{{name}: {value}}}\n"
    rc, msg = outcome(text)
    assert rc == 2 and (field in msg or "schedule" in msg), msg
