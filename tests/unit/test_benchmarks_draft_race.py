"""benchmarks/bench_draft_race.py at toy sizes on the CPU: it runs, times both sides and
writes its JSON; the two sides pick the same tokens (on the CPU both are the torch race:
the kernel's own agreement is tests/kernels/test_sample_kernel.py's).

Data flow (tests only): main([...small sizes...]) -> JSON.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_draft_race_benchmark_at_toy_sizes(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_draft_race",
                                                  ROOT / "benchmarks" / "bench_draft_race.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "race.json"
    assert module.main(["--rows", "2", "6", "--draft-vocab", "300", "--target-vocab", "1000",
                        "--iters", "2", "--device", "cpu", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["rows"] for r in data["results"]] == [2, 6]
    assert all(r["agree"] == 1.0 and r["torch_ms"] > 0 and r["fused_ms"] > 0
               for r in data["results"])
    assert "| 6 |" in capsys.readouterr().out
