"""`gearshift bench serve --sweep-rates R1,R2,...`: one `bench serve` run per Poisson request
rate (inf: all at once), with `--compare-speculative` each also with `"speculative": false`
(every request decodes plainly, on the same server), so speculation's TTFT, TPOT and
throughput can be read against load on one plot. Every run sends the same prompts, so the
server's prefix cache is cleared before each (`--no-reset-prefix-cache` keeps it): else
every run after the first finds its prompts cached and measures no prefill.

Fairness between the modes: what a server pays once (the first batch of a new size, say)
falls on whichever run meets it first. So the sweep starts with an untimed burst of its
prompts at once in each mode, as many as --concurrency allows in flight (`--no-sweep-warmup`
skips it; its summaries are kept under "warmup"), and the modes take turns at going first
from one rate to the next ("order").

A run sends --num-prompts prompts; with `--sweep-seconds S`, a run at rate r sends
max(--num-prompts, r x S) (`rate_prompts`): at a low rate a few dozen requests take S
seconds already, at a high rate they arrive in a blink and their p99 is their slowest one.

Data flow: args -> bench(args at each rate[, no_speculative]) -> summaries -> JSON
{rates, runs: {label: [summary per rate]}, order, warmup} + PNG (TTFT p50 / p99, TPOT p50, output tok/s).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math

import httpx

# Gearshift's and vLLM's admin route, then SGLang's
RESET_ROUTES = ("/reset_prefix_cache", "/flush_cache")


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--sweep-rates: expected numbers or inf, got {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise ValueError("--sweep-rates: every rate must be > 0")
    return sorted(rates)


def rate_prompts(args, rate: float) -> int:
    """How many prompts the run at `rate` sends."""
    if math.isinf(rate) or not args.sweep_seconds:
        return args.num_prompts
    return max(args.num_prompts, math.ceil(rate * args.sweep_seconds))


def run_rate_sweep(args) -> int:
    from gearshift.bench import require_extras

    require_extras("rich", "matplotlib")
    rates = parse_rates(args.sweep_rates)
    labels = ["speculative", "plain"] if args.compare_speculative else \
        ["plain" if args.no_speculative else "default"]
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    reset = [args.reset_prefix_cache]
    warmup = {}
    if args.sweep_warmup:
        for label in labels:
            warmup[label] = _run(args, label, float("inf"), reset, warmup=0,
                                 prompts=min(args.num_prompts, args.concurrency))
            print(f"warm-up burst, {label}: TTFT p50 {warmup[label]['ttft_ms']['p50']} ms "
                  f"(untimed)")
    order = []
    out = {"rates": rates, "runs": runs, "order": order, "warmup": warmup}
    for i, rate in enumerate(rates):
        order.append(labels if i % 2 == 0 else labels[::-1])  # neither mode always first
        for label in order[-1]:
            result = _run(args, label, rate, reset, prompts=rate_prompts(args, rate))
            runs[label].append(result)
            print(f"rate {rate:g}/s {label}: output tok/s {result['output_tok_per_s']:.1f}, "
                  f"TTFT p50 {result['ttft_ms']['p50']} ms, TPOT p50 {result['tpot_ms']['p50']} ms,"
                  f" failed {result['failed']}")
        with open(args.output_json, "w") as f:  # after every rate: a cut sweep keeps its rates
            json.dump(out, f, indent=1)
    plot(out, args.output_png)
    print(f"wrote {args.output_json} and {args.output_png}")
    return 0 if all(r["failed"] == 0 for rs in runs.values() for r in rs) else 1


def _run(args, label: str, rate: float, reset: list[bool], warmup: int | None = None,
         prompts: int | None = None) -> dict:
    """One `bench serve` run at `rate` in mode `label` (`prompts` of them: all by default),
    after clearing the prefix cache (reset[0]: still clearing; a server without the
    routes turns it off, with a warning)."""
    from gearshift.bench.serve import auth_headers, bench

    if reset[0] and not reset_prefix_cache(args.base_url, auth_headers(args)):
        print(f"warning: {args.base_url} has none of {', '.join(RESET_ROUTES)}: runs "
              "after the first may find their prompts in its prefix cache (see each "
              "run's prefix_cache_hit_rate)")
        reset[0] = False
    run = copy.copy(args)
    run.request_rate = rate
    run.no_speculative = label == "plain" or (label == "default" and args.no_speculative)
    if warmup is not None:
        run.warmup = warmup
    if prompts is not None:
        run.num_prompts = prompts
    return asyncio.run(bench(run))


def reset_prefix_cache(base_url: str, headers: dict) -> bool:
    """Clear the server's prefix cache; False where it has no route for it."""
    for route in RESET_ROUTES:
        try:
            r = httpx.post(base_url.rstrip("/") + route, headers=headers, timeout=60)
        except httpx.HTTPError as e:
            raise ValueError(f"cannot reach the server at {base_url}: {e}") from None
        if r.status_code in (404, 405):
            continue
        if r.status_code != 200:
            raise ValueError(f"POST {route} answered {r.status_code}: {r.text[:200]}")
        return True
    return False


def plot(sweep: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sweep["rates"]
    xs = [r if r != float("inf") else max([x for x in rates if x != float("inf")] or [1]) * 2
          for r in rates]
    panels = (("TTFT p50 (ms)", lambda r: r["ttft_ms"]["p50"]),
              ("TTFT p99 (ms)", lambda r: r["ttft_ms"]["p99"]),
              ("TPOT p50 (ms)", lambda r: r["tpot_ms"]["p50"]),
              ("output tok/s", lambda r: r["output_tok_per_s"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, (title, get) in zip(axes, panels):
        for label, results in sweep["runs"].items():
            ax.plot(xs, [get(r) for r in results], marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("request rate (/s; rightmost: all at once)" if float("inf") in rates
                      else "request rate (/s)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
