"""`gearshift bench ...`: benchmarks as commands that print tables and write JSON (+ PNG).

Tables (rich) and plots (matplotlib) come with the optional `[bench]` extra: a bench checks
for them before it measures anything (`require_extras`) and imports them only where it draws.
"""

from __future__ import annotations

import importlib
import sys


def percentile(xs: list[float], q: float) -> float | None:
    """The q-quantile of xs by rank (the value at index q * n of the sorted list); None if
    empty."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def require_extras(*modules: str) -> None:
    """Stop (exit code 2) with one line when an optional module a bench draws with is not
    installed, before anything is measured."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(f"gearshift bench: error: needs the [bench] extra ({', '.join(missing)} not "
              "installed): pip install 'gearshift[bench]'", file=sys.stderr)
        raise SystemExit(2)
