"""`gearshift bench serve`: load a running OpenAI-compatible server with an async streaming
client and measure time to first token (TTFT), time per output token (TPOT), inter-token
latency (ITL), throughput and the prefix cache's hit rate; prints a table and writes JSON.

Workloads (bench/workloads.py): `single` (independent prompts), `shared-prefix` (one
system prompt before every request's own text), `multi-turn` (conversations whose every
turn resends the history, the model's answers included, plus a new user message).

Data flow: args -> conversations -> Poisson (or immediate) arrivals, at most `concurrency`
in flight, a conversation's turns in order -> POST /v1/completions (stream, include_usage,
ignore_eos) -> per-request timings and cached tokens -> percentiles -> table + JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from tqdm.auto import tqdm

from gearshift import env
from gearshift.bench import require_extras
from gearshift.bench.workloads import add_workload_args, check_dataset, conversations


@dataclass(slots=True)
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds from send to the first text chunk
    latency: float = 0.0  # seconds from send to [DONE]
    itl: list[float] = field(default_factory=list)  # gaps between text chunks
    cached_tokens: int = 0  # prompt tokens the server's prefix cache served
    text: str = ""  # the completion (a multi-turn conversation resends it)
    error: str = ""


def add_serve_bench_args(p) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root URL")
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument("--api-key", default=None, help="default: $GEARSHIFT_API_KEY")
    p.add_argument("--concurrency", type=int, default=16, help="most requests in flight")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals per second (default: all at once)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens (ignore_eos)")
    add_workload_args(p)
    p.add_argument("--no-speculative", action="store_true",
                   help='send "speculative": false: every request decodes plainly')
    p.add_argument("--sweep-rates", default=None,
                   help="comma-separated request rates (inf: all at once): one run each, "
                        "TTFT / TPOT / throughput against rate in the JSON and a PNG")
    p.add_argument("--sweep-seconds", type=float, default=0.0,
                   help="--sweep-rates: at a rate r, send max(--num-prompts, r x SECONDS) "
                        "prompts, so that every rate's run lasts about SECONDS and its p99 "
                        "is that of many requests (0: --num-prompts at every rate)")
    p.add_argument("--compare-speculative", action="store_true",
                   help="--sweep-rates: each rate also without speculation, on one plot")
    p.add_argument("--reset-prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="--sweep-rates: clear the server's prefix cache before each run (every "
                        "run sends the same prompts)")
    p.add_argument("--sweep-warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="--sweep-rates: first an untimed burst of --concurrency prompts at "
                        "once in each mode, so that no timed run pays the server's first "
                        "large batch")
    p.add_argument("--output-png", default="bench_serve.png")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="untimed requests first")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--output-json", default="bench_serve.json")


def run_serve_bench(args) -> int:
    require_extras("rich")
    if args.concurrency < 1 or args.num_prompts < 1 or args.input_len < 1 or args.output_len < 1:
        raise ValueError("--concurrency, --num-prompts, --input-len and --output-len must be >= 1")
    if args.request_rate <= 0:
        raise ValueError("--request-rate must be > 0")
    if not args.sweep_seconds >= 0:
        raise ValueError("--sweep-seconds must be >= 0")
    if args.sweep_seconds and not args.sweep_rates:
        raise ValueError("--sweep-seconds applies to --sweep-rates runs only")
    check_dataset(args.dataset)
    if args.sweep_rates:
        from gearshift.bench.serve_sweep import run_rate_sweep

        return run_rate_sweep(args)
    result = asyncio.run(bench(args))
    print_table(result)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.output_json}")
    return 0 if result["failed"] == 0 else 1


def auth_headers(args) -> dict:
    """The bearer header of --api-key (else $GEARSHIFT_API_KEY), or none."""
    api_key = args.api_key or env.API_KEY.get()
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def bench(args) -> dict:
    headers = auth_headers(args)
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    timeout = httpx.Timeout(args.timeout, connect=30.0)
    async with httpx.AsyncClient(base_url=args.base_url.rstrip("/"), headers=headers,
                                 limits=limits, timeout=timeout) as client:
        model = args.model or await _first_model(client)
        convos = conversations(args)

        def body(request) -> tuple[str, dict]:
            chat = isinstance(request, list) and request and isinstance(request[0], dict)
            out = {"model": model, "max_tokens": args.output_len,
                   "temperature": args.temperature, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True},
                   "messages" if chat else "prompt": request}
            if args.no_speculative:
                out["speculative"] = False
            return ("/v1/chat/completions" if chat else "/v1/completions"), out

        for convo in convos[: args.warmup]:
            await one_request(client, *body(convo.first()))
        sem = asyncio.Semaphore(args.concurrency)
        rng = random.Random(args.seed + 1)
        bar = tqdm(total=sum(c.turns for c in convos[args.warmup:]), desc="bench serve",
                   unit="req")

        async def converse(convo) -> list[RequestResult]:
            out, prompt = [], convo.first()
            for turn in range(convo.turns):
                async with sem:
                    r = await one_request(client, *body(prompt))
                bar.update(1)
                out.append(r)
                if not r.ok:
                    break
                if turn + 1 < convo.turns:
                    prompt = convo.next(prompt, r.text, turn)
            return out

        start, started = time.perf_counter(), time.time()
        tasks = []
        for convo in convos[args.warmup:]:
            tasks.append(asyncio.create_task(converse(convo)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = [r for rs in await asyncio.gather(*tasks) for r in rs]
        duration = time.perf_counter() - start
        bar.close()
    return summarize(results, duration, args, model, window=(started, started + duration))


async def _first_model(client: httpx.AsyncClient) -> str:
    try:
        r = await client.get("/v1/models")
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach the server at {client.base_url}: {e}") from None
    if r.status_code != 200:
        raise ValueError(f"GET /v1/models answered {r.status_code}: {r.text[:200]}")
    return r.json()["data"][0]["id"]


async def one_request(client: httpx.AsyncClient, path: str, body: dict) -> RequestResult:
    """One streamed completion (or chat completion), timed chunk by chunk."""
    start = time.perf_counter()
    chunk_times: list[float] = []
    res = RequestResult(ok=False)
    try:
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    res.ok = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = obj["error"].get("message", "error event")
                    return res
                if obj.get("usage"):
                    res.prompt_tokens = obj["usage"]["prompt_tokens"]
                    res.output_tokens = obj["usage"]["completion_tokens"]
                    details = obj["usage"].get("prompt_tokens_details") or {}
                    res.cached_tokens = details.get("cached_tokens") or 0
                text = "".join(ch.get("text") or (ch.get("delta") or {}).get("content") or ""
                               for ch in obj.get("choices", []))
                if text:
                    chunk_times.append(time.perf_counter())
                    res.text += text
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.latency = time.perf_counter() - start
    if chunk_times:
        res.ttft = chunk_times[0] - start
        res.itl = [b - a for a, b in zip(chunk_times, chunk_times[1:], strict=False)]
    return res


def _pcts(xs: list[float]) -> dict:
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    xs = sorted(xs)

    def pick(q: float) -> float:
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1e3

    return {"mean": statistics.fmean(xs) * 1e3, "p50": pick(0.5), "p90": pick(0.9),
            "p99": pick(0.99)}


def summarize(results: list[RequestResult], duration: float, args, model: str,
              window: tuple[float, float] | None = None) -> dict:
    """`window`: the timed requests' Unix start and end (the warm-up's come before it): where
    a server's --step-trace holds this run's steps."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "base_url": args.base_url, "model": model,
        "config": {k: getattr(args, k) for k in ("concurrency", "num_prompts", "request_rate",
                                                 "input_len", "output_len", "dataset",
                                                 "temperature", "seed", "workload", "turns",
                                                 "shared_prefix_len", "no_speculative")},
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:10],
        "duration_s": duration,
        "window": None if window is None else [round(t, 4) for t in window],
        "request_throughput": len(ok) / duration,
        "output_tok_per_s": out_tokens / duration,
        "total_tok_per_s": (in_tokens + out_tokens) / duration,
        "prompt_tokens": in_tokens, "output_tokens": out_tokens,
        "cached_prompt_tokens": sum(r.cached_tokens for r in ok),
        "prefix_cache_hit_rate": sum(r.cached_tokens for r in ok) / in_tokens if in_tokens else 0.0,
        "ttft_ms": _pcts([r.ttft for r in ok]),
        "tpot_ms": _pcts(tpot),
        "itl_ms": _pcts([g for r in ok for g in r.itl]),
        "e2e_ms": _pcts([r.latency for r in ok]),
    }


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    t = Table(title=f"gearshift bench serve: {result['model']} @ {result['base_url']} "
                    f"(concurrency {cfg['concurrency']}, rate {cfg['request_rate']}/s, "
                    f"in {cfg['input_len']} / out {cfg['output_len']})")
    for col in ("metric", "mean", "p50", "p90", "p99"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    for key, label in (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"),
                       ("itl_ms", "ITL (ms)"), ("e2e_ms", "E2E latency (ms)")):
        row = result[key]
        t.add_row(label, *("-" if row[q] is None else f"{row[q]:.2f}"
                           for q in ("mean", "p50", "p90", "p99")))
    console = Console()
    console.print(t)
    console.print(
        f"completed {result['completed']}  failed {result['failed']}  "
        f"duration {result['duration_s']:.2f} s  requests/s {result['request_throughput']:.2f}  "
        f"output tok/s {result['output_tok_per_s']:.1f}  total tok/s "
        f"{result['total_tok_per_s']:.1f}  prefix-cache hit rate "
        f"{result['prefix_cache_hit_rate']:.1%}"
    )
    for err in result["errors"]:
        console.print(f"[red]error[/red]: {err}")
