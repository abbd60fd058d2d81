"""`gearshift bench ...`: benchmarks as commands that print tables and write JSON (+ PNG).

Tables (rich) and plots (matplotlib) come with the optional `[bench]` extra: a bench checks
for them before it measures anything (`require_extras`) and imports them only where it draws.
"""

from __future__ import annotations

import importlib


def require_extras(*modules: str) -> None:
    """Stop with one line when an optional module a bench draws with is not installed."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise SystemExit(f"gearshift bench needs {', '.join(missing)}: pip install gearshift[bench]")
