"""`gearshift bench sweep` on a hybrid engine: the hybrid, model-only and suffix-only
policies on one eagle3+suffix engine (the embedded default pair at toy size), the ratios
the hybrid's criteria read, and the proposer mix of each point.

Data flow (tests only): the CLI -> sweep (hybrid policies) -> JSON + printed ratio lines;
synthetic results -> bench/hybrid.py ratios.
"""

from __future__ import annotations

import json

import pytest

from gearshift.bench.hybrid import ratio_lines, ratios
from gearshift.cli import main


def test_a_sweep_compares_the_hybrid_with_each_proposer_alone(tmp_path, capsys):
    rc = main(["bench", "sweep", "--device", "cpu", "--workload", "mixed-agentic",
               "--concurrency", "2", "--rounds", "1", "--passes", "1", "--input-len", "48",
               "--output-len", "12", "--min-requests", "4", "--tree-width", "1",
               "--settle", "0", "--policies", "hybrid,model-only,suffix-only",
               "--output-json", str(tmp_path / "h.json"), "--output-png", str(tmp_path / "h.png")])
    assert rc == 0
    data = json.loads((tmp_path / "h.json").read_text())
    assert data["env"]["draft"]["algorithm"] == "eagle3+suffix"  # named by the policies
    res = data["results"]
    assert set(res) == {"hybrid", "model-only", "suffix-only"}
    assert res["model-only"][0]["proposer_steps"]["suffix"] == 0
    assert res["suffix-only"][0]["proposer_steps"]["eagle3"] == 0
    assert sum(res["hybrid"][0]["proposer_steps"].values()) > 0
    assert "x model-only" in capsys.readouterr().out


def test_hybrid_policies_need_a_hybrid_engine(tmp_path):
    with pytest.raises(SystemExit, match="needs a hybrid engine"):
        main(["bench", "sweep", "--device", "cpu", "--speculative-algorithm", "eagle3",
              "--concurrency", "1", "--rounds", "1", "--passes", "1", "--input-len", "16",
              "--output-len", "4", "--min-requests", "1", "--tree-width", "1", "--settle", "0",
              "--policies", "hybrid", "--output-json", str(tmp_path / "x.json"),
              "--output-png", str(tmp_path / "x.png")])


def test_the_ratios_set_the_hybrid_against_each_proposer():
    def point(c, tps, picks=None):
        return {"concurrency": c, "output_tok_per_s": tps, **({"proposer_steps": picks}
                                                               if picks else {})}

    results = {"hybrid": [point(1, 150.0, {"eagle3": 1, "suffix": 3}), point(8, 300.0)],
               "model-only": [point(1, 100.0), point(8, 250.0)],
               "suffix-only": [point(1, 120.0), point(8, 320.0)]}
    r = ratios(results)
    assert r[0]["over_model"] == pytest.approx(1.5)
    assert r[0]["over_best_single"] == pytest.approx(1.25)
    assert r[0]["suffix_share"] == pytest.approx(0.75)
    assert r[1]["over_best_single"] == pytest.approx(300 / 320)
    assert "1.500 x model-only" in ratio_lines(results)[0]
