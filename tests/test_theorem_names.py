"""The theorem a step names (the build table, derivation.json, report.md) is the lemma its
obligation is stated with (issue 20: the table said cache_read where the obligation used
cache_read2).  Both read the record's theorem, which the rule's check chooses."""
from __future__ import annotations

from pathlib import Path

import pytest
from derivc_testing import run_cli

from compiler.derive import derive
from compiler.obligations import obligation_for
from compiler.schedule_variants import expand
from compiler.spec import load_spec_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_step_names_its_obligations_theorem(example: Path):
    spec = expand(load_spec_file(example))[0].spec
    d = derive(spec, str(example), check=False)
    for rec, before, after in zip(d.steps, d.programs, d.programs[1:]):
        ob = obligation_for(rec, before, after)
        assert rec.theorem == ob.theorem, f"step {rec.index} ({rec.rule}): {rec.theorem} vs {ob.theorem}"


def test_build_table_names_cache_read2(tmp_path: Path):
    """A staged tile is cache_read2, an accumulator cache_read: in derivation.json and the table."""
    import json

    rc, out, err = run_cli(["build", str(EXAMPLES / "gemm.yaml"), "-o", str(tmp_path / "b"), "--no-codegen"])
    assert rc == 0, err
    steps = json.loads((tmp_path / "b" / "derivation.json").read_text())["steps"]
    caches = [s for s in steps if s["rule"] == "cache"]
    want = {s["index"]: "cache_read" if "accumulator" in s["params"] else "cache_read2" for s in caches}
    assert "cache_read2" in want.values() and "cache_read" in want.values()
    rows = {int(cells[0]): cells[3] for ln in out.splitlines()
            if len(cells := [c.strip() for c in ln.strip("│|").split("│")]) >= 4 and cells[0].isdigit()}
    assert {s["index"]: s["theorem"] for s in caches} == want
    assert {k: rows[k] for k in want} == want, out
