"""What a K per request could gain over one K per step on the mixed workload, at most: a
model of the step fitted to a mixed sweep's JSON, and each class's acceptance per draft
position, measured on this machine's CPU with the default pair (the bench pair's target is
the default model widened: the same text, the same acceptance).

    python benchmarks/mixed_bound.py OUT/mixed.json [--accept GREEDY,SAMPLED]

The sweep must hold `off`, `always-2` and `goodput` at each concurrency it reports. Model,
per concurrency c (half the requests greedy, half sampled):
    step(K_g, K_s) = decode + slope * c/2 * (K_g + K_s)         the target's pass
                     + host + draft * max(K_g, K_s)             where anything speculates
    tok/s(K_g, K_s) = c/2 * (E(K_g, a_g) + E(K_s, a_s)) / step,  E(K, a) = 1 + a + ... + a^K
decode: `off`'s device ms a step; slope: `always-2`'s verify device ms over it, per drafted
token; draft: between goodput's two most used K, the wall ms a step more per K, less the
tokens' share; host: `always-2`'s wall ms outside its device ms, less its two draft steps.
The bound is the best (K_g, K_s) over the best single K, with each overhead as measured,
free, and with a draft step costing in proportion to the rows it drafts.

Data flow: the sweep JSON -> fit() ; acceptance() (CPU engine) -> bounds() -> a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gearshift

K_MAX = 4


def tokens(k: int, a: float) -> float:
    """Expected tokens a chain of k drafts yields: the bonus token and each accepted prefix."""
    return sum(a ** i for i in range(k + 1))


def fit(point: dict[str, dict]) -> dict[str, float]:
    """The step model's terms (ms) from one concurrency's points of off, always-2, goodput."""
    c = point["off"]["concurrency"]
    decode = statistics.median(point["off"]["device_ms_median_by_mode"]["decode"])
    two = point["always-2"]
    verify_dev = statistics.median(two["device_ms_median_by_mode"]["verify"])
    verify_wall = statistics.median(two["step_ms_median_by_mode"]["verify"])
    slope = (verify_dev - decode) / (2 * c)
    gears = {int(k): 1e3 * s / n for k, (s, n) in point["goodput"]["verify_s_by_gear"].items()}
    used = point["goodput"]["verify_s_by_gear"]
    k = max((g for g in gears if g + 1 in gears), key=lambda g: min(used[str(g)][1],
                                                                     used[str(g + 1)][1]))
    draft = gears[k + 1] - gears[k] - slope * c
    return {"c": c, "decode": decode, "slope": slope, "draft": draft,
            "host": verify_wall - verify_dev - 2 * draft}


def bound(m: dict[str, float], a_g: float, a_s: float, draft_by_rows: bool = False) -> dict:
    half = m["c"] // 2

    def step(kg: int, ks: int) -> float:
        t = m["decode"] + m["slope"] * half * (kg + ks)
        if kg or ks:
            drafted = (kg + ks) / 2 if draft_by_rows else max(kg, ks)
            t += m["host"] + m["draft"] * drafted
        return t

    def rate(kg: int, ks: int) -> float:
        return 1e3 * half * (tokens(kg, a_g) + tokens(ks, a_s)) / step(kg, ks)

    one = max(range(K_MAX + 1), key=lambda k: rate(k, k))
    each = max(itertools.product(range(K_MAX + 1), repeat=2), key=lambda ks: rate(*ks))
    return {"one_k": one, "one_tok_s": rate(one, one), "per_class_k": each,
            "per_class_tok_s": rate(*each), "ratio": rate(*each) / rate(one, one)}


def acceptance(temperature: float, n: int = 16, k: int = K_MAX) -> tuple[float, float]:
    """Greedy and sampled requests' acceptance per draft position: chains of k on the CPU
    with the default pair, 128-token held-out prompts, 128 tokens out, solved from each
    class's mean accepted drafts a step (sum over i <= k of a^i)."""
    from gearshift import LLM, SamplingParams
    from gearshift.bench.sweep import make_prompts

    llm = LLM(device="cpu", speculative_algorithm="eagle3", num_draft_tokens=k,
              spec_policy="always", max_num_seqs=2 * n)
    prompts = make_prompts(llm.tokenizer, llm.engine.model_config.vocab_size, 2 * n, 128, 0)
    params = [SamplingParams(temperature=0.0 if i % 2 == 0 else temperature, max_tokens=128,
                             ignore_eos=True, seed=i) for i in range(2 * n)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    alphas = []
    for cls in (0, 1):
        spec = [o.spec for i, o in enumerate(outs) if i % 2 == cls]
        mean = sum(s.accepted for s in spec) / sum(s.verify_steps for s in spec)
        lo, hi = 0.0, 1.0
        for _ in range(50):  # tokens(k, a) - 1 grows with a: bisect
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tokens(k, mid) - 1 < mean else (lo, mid)
        alphas.append((lo + hi) / 2)
    return alphas[0], alphas[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path, help="a `bench sweep --workload mixed` JSON")
    p.add_argument("--accept", help="GREEDY,SAMPLED acceptance per draft position "
                                    "(default: measured on the CPU)")
    args = p.parse_args(argv)
    data = json.loads(args.sweep.read_text())
    if args.accept:
        a_g, a_s = (float(x) for x in args.accept.split(","))
    else:
        a_g, a_s = acceptance(data["args"]["sampled_temperature"])
    print(f"acceptance per draft position: greedy {a_g:.3f}, sampled {a_s:.3f}\n")
    print("| c | decode ms | ms a verified token | draft step ms | host ms | one K: K, tok/s | "
          "a K per class | bound | draft free, host free | draft by rows |")
    print("|---:|---:|---:|---:|---:|---|---|---:|---:|---:|")
    results = data["results"]
    for c in sorted({p["concurrency"] for p in results["off"]}):
        point = {name: next(p for p in results[name] if p["concurrency"] == c)
                 for name in ("off", "always-2", "goodput")}
        m = fit(point)
        b = bound(m, a_g, a_s)
        free = bound({**m, "draft": 0.0, "host": 0.0}, a_g, a_s)
        rows = bound(m, a_g, a_s, draft_by_rows=True)
        print(f"| {c} | {m['decode']:.2f} | {m['slope']:.4f} | {m['draft']:.2f} | "
              f"{m['host']:.2f} | {b['one_k']}, {b['one_tok_s']:,.0f} | {b['per_class_k']}, "
              f"{b['per_class_tok_s']:,.0f} | **{b['ratio']:.3f}** | {free['ratio']:.3f} | "
              f"{rows['ratio']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
