"""benchmarks/*.sh in their CPU smoke mode (H200_SMOKE=1: toy sizes, the widened default
model), for the tests that keep those scripts from rotting between GPU runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def smoke(script: str, out: Path, cwd: Path | None = None, timeout: int = 400,
          **env: str) -> subprocess.CompletedProcess:
    """bash benchmarks/SCRIPT writing under `out` (one thread; COMMIT=smoketest unless
    given), from `cwd` (default: out's parent). Not checked: see ok()."""
    env = {**os.environ, "H200_SMOKE": "1", "OUT": str(out), "OMP_NUM_THREADS": "1",
           "COMMIT": "smoketest", **env}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / script)], cwd=cwd or out.parent,
                          env=env, capture_output=True, text=True, timeout=timeout)


def ok(run: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """The run, once it exited 0 (else its output's tails as the failure)."""
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run
