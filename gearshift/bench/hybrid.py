"""`bench sweep` on a hybrid engine (`--speculative-algorithm eagle3+suffix`): the hybrid
against each of its proposers alone, all three priced by goodput on one engine:

    hybrid        a proposer and a length per request (policy/hybrid.py)
    model-only    EAGLE-3 (or the draft model) alone: goodput as without suffix decoding
    suffix-only   suffix decoding alone, at the lengths its calibrated matches pay for

The ratios the hybrid's criteria read, per concurrency: hybrid / model-only (agentic
c = 1, 8: >= 1.5; novel text: >= 0.97) and hybrid / the better single proposer
(mixed-agentic c = 8, 32: >= 1.15). They print on any device; the verdicts are the
caller's (sweep.py judges on a GPU only).

Data flow: sweep.policy_object(name) -> hybrid_policy(...) -> Engine.set_policy per point;
sweep results -> ratio_lines(results) -> printed lines.
"""

from __future__ import annotations

HYBRID_POLICIES = ("hybrid", "model-only", "suffix-only")
MODE = {"hybrid": "both", "model-only": "model", "suffix-only": "suffix"}


def hybrid_policy(name: str, engine, goodput):
    """`goodput`: a fresh GoodputPolicy for the model proposer's gears."""
    from gearshift.policy.hybrid import HybridPolicy

    if not engine.config.hybrid:
        raise SystemExit(f"error: policy {name} needs a hybrid engine "
                         "(--speculative-algorithm eagle3+suffix or draft+suffix)")
    return HybridPolicy(goodput, engine.config.model_algorithm, mode=MODE[name])


def ratios(results: dict) -> list[dict]:
    """Per concurrency: hybrid over model-only and over the better single proposer, and
    the hybrid's share of request-steps drafted by suffix decoding (the proposer mix)."""
    at = {name: {p["concurrency"]: p for p in pts} for name, pts in results.items()}
    out = []
    for c, h in sorted(at.get("hybrid", {}).items()):
        m, s = at.get("model-only", {}).get(c), at.get("suffix-only", {}).get(c)
        row = {"concurrency": c, "tok_per_s": h["output_tok_per_s"]}
        if m is not None:
            row["over_model"] = h["output_tok_per_s"] / m["output_tok_per_s"]
        singles = [p["output_tok_per_s"] for p in (m, s) if p is not None]
        if singles:
            row["over_best_single"] = h["output_tok_per_s"] / max(singles)
        picks = h.get("proposer_steps") or {}
        if picks:
            row["suffix_share"] = picks.get("suffix", 0) / max(sum(picks.values()), 1)
        out.append(row)
    return out


def ratio_lines(results: dict) -> list[str]:
    lines = []
    for r in ratios(results):
        parts = [f"c={r['concurrency']}: hybrid {r['tok_per_s']:.1f} tok/s"]
        for key, label in (("over_model", "x model-only"), ("over_best_single", "x best single"),
                           ("suffix_share", "suffix share of drafts")):
            if key in r:
                parts.append(f"{r[key]:.3f} {label}")
        lines.append(", ".join(parts))
    return lines
