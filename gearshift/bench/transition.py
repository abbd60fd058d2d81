"""`gearshift bench sweep --workload transition`: does goodput find the best gear again when
the traffic changes? One closed loop per concurrency and policy runs three phases back to
back, with nothing reset between them (the policy keeps what it learned):

    code      held-out corpus windows, greedy (the draft's domain: high acceptance)
    words     random English words sampled at --sampled-temperature (drafts mostly
              rejected: plain decode is best; greedy text on them falls into loops the
              draft predicts well, so the phase samples)
    code      other corpus windows, greedy (speculation pays again)

Each phase is timed on its own; per phase, goodput's tok/s is set against the best fixed
policy of that phase (criterion on the GPU bench pair: >= 0.95 in every phase). Passes
interleave the policies as the uniform sweep does.

Data flow: sweep.run -> transition_sweep(engine, policies, phases, args) -> per policy, per
concurrency {"concurrency", "phases": [point per phase]} -> transition_table / verdicts.
"""

from __future__ import annotations

import random

from gearshift.bench.sweep_point import merge_passes, run_point
from gearshift.bench.workloads import WORDS

PHASES = ("code", "words", "code")
PHASE_RATIO = 0.95  # goodput / the best fixed policy, in every phase
FIXED = ("off", "always-2", "always-4", "tree")  # the policies that never adapt


def word_prompts(tokenizer, n: int, input_len: int, seed: int) -> list[list[int]]:
    """n prompts of random words, input_len tokens each (off the draft's domain)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids: list[int] = []
        while len(ids) < input_len:
            ids += tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(input_len)))
        out.append(ids[:input_len])
    return out


def phase_prompts(code: list[list[int]], words: list[list[int]], n: int, i: int) -> list:
    """The prompts of pass i's three phases, n each: code windows, words, other windows."""
    a, b = code[2 * i * n:(2 * i + 1) * n], code[(2 * i + 1) * n:(2 * i + 2) * n]
    return [a, words[i * n:(i + 1) * n], b]


def run_transition(engine, phases: list[list[list[int]]], c: int, output_len: int,
                   words_temperature: float) -> list[dict]:
    """The phases back to back on the engine's current policy; only the first is warmed up
    (a later phase must meet its change of traffic cold)."""
    temps = (0.0, words_temperature, 0.0)
    return [run_point(engine, prompts, c, output_len, temperature=t, warm=i == 0)
            for i, (prompts, t) in enumerate(zip(phases, temps))]


def transition_sweep(engine, policies: dict, code: list, words: list, n_of, args, bar,
                     done=None) -> dict:
    """-> {policy: [{"concurrency": c, "phases": [merged point per phase]}]}; `n_of(c)`:
    prompts per phase and pass at concurrency c."""
    names = list(policies)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for c in args.concurrency:
        n = n_of(c)
        parts: dict[str, list[list[dict]]] = {name: [] for name in names}
        for i in range(args.passes):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                engine.set_policy(policies[name])
                parts[name].append(run_transition(engine, phase_prompts(code, words, n, i), c,
                                                  args.output_len, args.sampled_temperature))
                bar.update(1 / args.passes)
        for name in names:
            phases = [merge_passes([p[j] for p in parts[name]]) for j in range(len(PHASES))]
            results[name].append({"concurrency": c, "phases": phases})
        if done is not None:
            done(results)
    return results


def verdicts(results: dict, ref: str = "goodput") -> dict:
    """{"points": [{concurrency, phase, name, best_fixed, ratio}], "min_ratio", "pass"}."""
    points = []
    fixed = [q for q in results if q in FIXED or q.startswith("tree")]
    for j, row in enumerate(results.get(ref, [])):
        c = row["concurrency"]
        for p, phase in enumerate(PHASES):
            tps = {q: results[q][j]["phases"][p]["output_tok_per_s"] for q in fixed}
            if not tps:
                continue
            best = max(tps, key=tps.get)
            points.append({"concurrency": c, "phase": p + 1, "name": phase, "best_fixed": best,
                           "ratio": row["phases"][p]["output_tok_per_s"] / tps[best]})
    ratios = [p["ratio"] for p in points]
    return {"points": points, "min_ratio": min(ratios) if ratios else None,
            "pass": bool(ratios) and min(ratios) >= PHASE_RATIO}


def markdown_table(results: dict, ref: str = "goodput") -> str:
    """Output tok/s (acceptance) per policy, concurrency and phase; goodput / best fixed."""
    pols = list(results)
    v = {(p["concurrency"], p["phase"]): p for p in verdicts(results, ref)["points"]}
    lines = ["| c | phase | " + " | ".join(pols) + f" | best fixed | {ref} / best fixed |",
             "|---:|---|" + "---:|" * len(pols) + "---|---:|"]
    for j, row in enumerate(results.get(ref) or next(iter(results.values()))):
        c = row["concurrency"]
        for p, phase in enumerate(PHASES):
            cells = []
            for q in pols:
                pt = results[q][j]["phases"][p]
                acc = pt.get("acceptance_rate")
                cells.append(f"{pt['output_tok_per_s']:,.0f}"
                             + (f" ({acc:.2f})" if acc is not None else ""))
            vp = v.get((c, p + 1))
            lines.append(f"| {c} | {p + 1}: {phase} | " + " | ".join(cells) + " | "
                         + (f"{vp['best_fixed']} | **{vp['ratio']:.3f}** |" if vp else "- | - |"))
    return "\n".join(lines)


def verdict_lines(v: dict, judged: bool) -> list[str]:
    if v["min_ratio"] is None:
        return []
    text = f"goodput >= {PHASE_RATIO} x the best fixed policy in every phase"
    if not judged:
        return [f"{text}: min {v['min_ratio']:.3f} (not judged here)"]
    return [f"{text}: {'PASS' if v['pass'] else 'FAIL'} (min {v['min_ratio']:.3f})"]


def plot(results: dict, path: str) -> None:
    """Output tok/s per phase, one panel per concurrency, a bar per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = next(iter(results.values()), [])
    fig, axes = plt.subplots(1, max(len(rows), 1), figsize=(4.5 * max(len(rows), 1), 3.6),
                             squeeze=False)
    width = 0.8 / max(len(results), 1)
    for j, ax in enumerate(axes[0][:len(rows)]):
        for q, (name, pts) in enumerate(results.items()):
            ys = [ph["output_tok_per_s"] for ph in pts[j]["phases"]]
            ax.bar([p + q * width for p in range(len(PHASES))], ys, width, label=name)
        ax.set_xticks([p + 0.4 - width / 2 for p in range(len(PHASES))],
                      [f"{p + 1}: {n}" for p, n in enumerate(PHASES)])
        ax.set_title(f"c = {rows[j]['concurrency']}: output tokens/s")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
