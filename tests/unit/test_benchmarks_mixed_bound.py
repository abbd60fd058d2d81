"""benchmarks/mixed_bound.py: the step model it fits from a mixed sweep's JSON gives back
the terms a sweep made from that model holds, and the bound of a K per class over one K
behaves as the model says (never below 1; a class that accepts nothing gets no drafts once
drafting is free; equal classes gain nothing from being told apart).

Data flow (tests only): a sweep JSON written from known terms -> fit / bound / main.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TERMS = {"c": 32, "decode": 6.0, "slope": 0.02, "draft": 0.5, "host": 1.5}


def _module():
    spec = importlib.util.spec_from_file_location("mixed_bound",
                                                  ROOT / "benchmarks" / "mixed_bound.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sweep(t: dict) -> dict:
    """off, always-2 and goodput at c as the step model with terms `t` times them."""
    c = t["c"]

    def verify(k: int) -> tuple[float, float]:  # (device ms, wall ms) of a step at K = k
        device = t["decode"] + t["slope"] * c * k
        return device, device + t["host"] + t["draft"] * k

    dev2, wall2 = verify(2)
    gears = {str(k): [verify(k)[1] * n / 1e3, n] for k, n in ((2, 40), (3, 300), (4, 200))}
    point = {"concurrency": c}
    return {"args": {"sampled_temperature": 1.2}, "results": {
        "off": [{**point, "device_ms_median_by_mode": {"decode": [t["decode"]] * 2}}],
        "always-2": [{**point, "device_ms_median_by_mode": {"verify": [dev2, dev2]},
                      "step_ms_median_by_mode": {"verify": [wall2, wall2]}}],
        "goodput": [{**point, "verify_s_by_gear": gears}]}}


def test_the_fit_gives_back_the_terms_the_sweep_was_made_from():
    point = {name: pts[0] for name, pts in _sweep(TERMS)["results"].items()}
    fitted = _module().fit(point)
    assert fitted == pytest.approx(TERMS)


def test_the_bound_follows_the_model():
    mb = _module()
    free = {**TERMS, "draft": 0.0, "host": 0.0}
    for a_g, a_s in ((0.8, 0.4), (0.6, 0.6), (0.9, 0.0)):
        assert mb.bound(TERMS, a_g, a_s)["ratio"] >= 1.0
    # equal classes: nothing to gain from telling them apart
    assert mb.bound(free, 0.6, 0.6)["ratio"] == pytest.approx(1.0)
    # a class that accepts nothing gets no drafts once drafting costs nothing but its tokens
    each = mb.bound(free, 0.9, 0.0)
    assert each["per_class_k"][1] == 0 and each["ratio"] > 1.05
    # a draft step by rows costs less than by the longest chain: the bound can only grow
    assert mb.bound(TERMS, 0.8, 0.3, draft_by_rows=True)["ratio"] >= \
        mb.bound(TERMS, 0.8, 0.3)["ratio"] - 1e-9
    assert mb.tokens(2, 0.5) == pytest.approx(1.75)


def test_the_table_from_a_sweep_file(tmp_path, capsys):
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(_sweep(TERMS)))
    assert _module().main([str(path), "--accept", "0.8,0.4"]) == 0
    out = capsys.readouterr().out
    assert "greedy 0.800, sampled 0.400" in out
    row = next(line for line in out.splitlines() if line.startswith("| 32 |"))
    assert "| 6.00 | 0.0200 | 0.50 | 1.50 |" in row


def test_greedy_requests_accept_more_than_sampled_ones_on_the_default_pair():
    a_g, a_s = _module().acceptance(1.2, n=4, k=2)
    assert 0.0 < a_s < a_g < 1.0
