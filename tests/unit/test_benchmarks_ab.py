"""benchmarks/ab.sh end to end in its CPU smoke mode: each side's sweep runs with its own
tree's code (PYTHONPATH), the other tree gets the package data a `git archive` of .py files
lacks, and ab_report.py puts the points side by side.

Data flow (tests only): bash benchmarks/ab.sh (subprocess) -> OUT/* -> assertions.
"""

from __future__ import annotations

import json
import shutil

from bench_smoke import ROOT, ok, smoke


def test_smoke_ab_runs_each_side_with_its_own_code(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(ROOT / "gearshift", old / "gearshift",
                    ignore=shutil.ignore_patterns("default_model", "presets", "__pycache__"))
    sweep = old / "gearshift" / "bench" / "sweep.py"  # the old side marks its JSON
    text = sweep.read_text()
    assert '"args": vars(args) | {"func": None}' in text
    sweep.write_text(text.replace('"args": vars(args) | {"func": None}',
                                  '"args": vars(args) | {"func": None, "side": "old"}'))
    out = tmp_path / "out"
    ok(smoke("ab.sh", out, timeout=240, OLD=str(old), POLICIES="goodput,always-2"))
    steps = [json.loads(line)["step"] for line in (out / "steps.jsonl").read_text().splitlines()]
    assert steps == ["pair", "ab_new", "ab_old"]
    assert json.loads((out / "ab_old.json").read_text())["args"].get("side") == "old"
    assert "side" not in json.loads((out / "ab_new.json").read_text())["args"]
    assert (old / "gearshift" / "default_model" / "target" / "config.json").is_file()
    table = (out / "ab.md").read_text()
    assert "commit smoketest (new)" in table
    rows = [line for line in table.splitlines() if line.startswith("| goodput |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1", "2"]
    assert all(r.split("|")[5].strip() not in ("", "-") for r in rows)  # new / old
    # the traces' VERIFY steps, cut out by each point's windows: always-2 speculates at
    # every point (goodput on the CPU may not)
    fixed = [line for line in table.splitlines() if line.startswith("| always-2 |")]
    assert len(fixed) == 2
    assert all(x.strip() != "-" for r in fixed for x in r.split("|")[7].split("/"))


def test_ab_refuses_a_tree_without_the_package(tmp_path):
    run = smoke("ab.sh", tmp_path / "out", timeout=60, OLD=str(tmp_path))
    assert run.returncode == 2 and "has no gearshift/ package" in run.stdout
