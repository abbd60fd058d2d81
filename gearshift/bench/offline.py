"""`gearshift bench offline`: the engine on synthetic prompts (random token ids, fixed
lengths, ignore_eos), two ways:

  throughput    N prompts at once (at most --max-num-seqs running, --max-num-batched-tokens
                a step): output tok/s = N x output_len / wall time of the run, step medians
  decode table  --batch-sizes 1,32,128: per batch size b, b prompts run to the end; the
                median wall (and device) time of the full-batch DECODE steps. With a draft
                configured at --spec-policy off, the same table against one without a
                draft is the tax of idle speculation (benchmarks/report.py divides them)

Prints a table and writes JSON (with the environment: device, model shape, engine flags).

Data flow: args -> LLM -> Engine.add_request x N -> Engine.step() loop timed per step
(each step ends in its one host sync, so wall time per step is the device time).
"""

from __future__ import annotations

import json
import statistics
import time

from tqdm.auto import tqdm

from gearshift.bench import percentile, require_extras
from gearshift.bench.environment import environment
from gearshift.request import SamplingParams
from gearshift.runner.jit_log import triton_compiles

SKIP_DECODE_STEPS = 4  # a decode table's first full-batch steps follow the prefill: not steady


def synthetic_prompts(n: int, input_len: int, vocab: int, seed: int) -> list[list[int]]:
    import torch  # here: `gearshift --help` builds this bench's parser without torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n, input_len), generator=g).tolist()


def run_offline(llm, *, num_prompts: int, input_len: int, output_len: int, seed: int = 0,
                temperature: float = 0.0, warmup_steps: int = 3,
                profile: tuple[int, int, str] | None = None, progress: bool = True) -> dict:
    """`profile`: (first step, steps, path): those timed steps run under torch.profiler
    (CUDA graphs stay on; their kernels are listed) and a kernel table is written to path.
    Steps under the profiler run slower: don't quote the run's throughput then."""
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=output_len, temperature=temperature, ignore_eos=True)
    # warm-up: a short request, so kernels are compiled before timing
    engine.add_request("warmup", synthetic_prompts(1, min(input_len, 64), vocab, seed + 1)[0],
                       SamplingParams(max_tokens=warmup_steps, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    for i, p in enumerate(synthetic_prompts(num_prompts, input_len, vocab, seed)):
        engine.add_request(f"bench-{i}", p, params)
    steps: list[dict] = []
    bar = tqdm(total=num_prompts * output_len, desc="bench offline", unit="tok", disable=not progress)
    prof = None
    with triton_compiles() as compiles:
        t_start = time.perf_counter()
        while engine.has_unfinished_requests():
            if profile is not None and len(steps) == profile[0]:
                prof = _start_profiler()
            if prof is not None and len(steps) == profile[0] + profile[1]:
                _write_profile(prof, profile[2], steps[profile[0]:])
                prof = None
            bs, waiting = engine.num_running(), engine.num_waiting()
            t0 = time.perf_counter()
            outs = engine.step()
            dt = time.perf_counter() - t0
            last = engine.last_step
            dev = last.get("device_ms")
            if engine.overlap and last.get("mode") != "verify":  # it reports the step before it
                if steps:
                    steps[-1]["device_ms"] = dev
                dev = None
            steps.append({"mode": last.get("mode"), "batch_size": last.get("batch_size"),
                          "device_ms": dev,
                          "running_before": bs, "waiting_before": waiting,
                          "time_ms": dt * 1e3, "new_tokens": len(outs)})
            bar.update(len(outs))
        elapsed = time.perf_counter() - t_start
    if prof is not None:
        _write_profile(prof, profile[2], steps[profile[0]:])
    bar.close()
    decode = [s["time_ms"] for s in steps if s["mode"] == "decode"]
    extend = [s["time_ms"] for s in steps if s["mode"] == "extend"]
    full_decode = [s["time_ms"] for s in steps if s["mode"] == "decode" and s["waiting_before"] == 0]
    out_tokens = num_prompts * output_len
    return {
        "num_prompts": num_prompts, "input_len": input_len, "output_len": output_len,
        "elapsed_s": elapsed, "output_tok_per_s": out_tokens / elapsed,
        "total_tok_per_s": num_prompts * (input_len + output_len) / elapsed,
        "steps": len(steps), "decode_steps": len(decode), "extend_steps": len(extend),
        # where the run's time went: mixed (prefill) steps against plain decode steps
        "decode_s": sum(decode) / 1e3, "extend_s": sum(extend) / 1e3,
        "mean_running": statistics.fmean(s["running_before"] for s in steps) if steps else None,
        "decode_step_ms_median": statistics.median(decode) if decode else None,
        "decode_step_ms_mean": statistics.fmean(decode) if decode else None,
        "decode_step_ms_p90": percentile(decode, 0.9),
        "decode_step_ms_median_no_queue": statistics.median(full_decode) if full_decode else None,
        "decode_device_ms_median": _median([s["device_ms"] for s in steps if s["mode"] == "decode"]),
        "extend_step_ms_median": statistics.median(extend) if extend else None,
        # one-off costs inside the timed run (None: not observable without Triton's hook)
        "triton_compiles": list(compiles) if compiles.available else None,
        "preemptions": engine.stats()["preemptions"],
        "graphs": engine.stats()["graphs"],  # graphed vs eager steps per mode
        "step_log": steps,
    }


def decode_table(llm, batch_sizes: list[int], *, input_len: int, output_len: int, seed: int = 0,
                 skip: int = SKIP_DECODE_STEPS) -> list[dict]:
    """Per batch size b: b prompts run to the end (run_offline); the full-batch DECODE steps
    after the first `skip` give the step's median wall and device time."""
    rows = []
    for bs in batch_sizes:
        r = run_offline(llm, num_prompts=bs, input_len=input_len, output_len=output_len,
                        seed=seed, progress=False)
        full = [s for s in r["step_log"] if s["mode"] == "decode" and s["batch_size"] == bs][skip:]
        wall = [s["time_ms"] for s in full]
        rows.append({"batch_size": bs, "steps": len(full),
                     "step_ms_median": statistics.median(wall) if wall else None,
                     "step_ms_p90": percentile(wall, 0.9),
                     "device_ms_median": _median([s["device_ms"] for s in full])})
    return rows


def _start_profiler():
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    return prof


def _write_profile(prof, path: str, steps: list[dict]) -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.__exit__(None, None, None)
    modes = sorted({f"{s['mode']}@{s['batch_size']}" for s in steps})
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=45, max_name_column_width=70)
    with open(path, "w") as f:
        f.write(f"# {len(steps)} steps ({', '.join(modes)}), "
                f"wall ms {[round(s['time_ms'], 2) for s in steps]}\n{table}\n")


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="gearshift bench offline")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key in ("num_prompts", "input_len", "output_len", "elapsed_s", "output_tok_per_s",
                "total_tok_per_s", "steps", "decode_steps", "extend_steps", "mean_running",
                "decode_step_ms_median", "decode_step_ms_p90", "decode_step_ms_median_no_queue",
                "decode_device_ms_median", "extend_step_ms_median", "preemptions"):
        t.add_row(key, _fmt(result[key]))
    Console().print(t)


def print_decode_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"decode step by batch size ({result['input_len']} prompt tokens, "
                    f"{result['output_len']} output)")
    for col in ("batch", "steps", "wall ms (median)", "wall ms (p90)", "device ms (median)"):
        t.add_column(col, justify="right")
    for r in result["decode_by_batch"]:
        t.add_row(str(r["batch_size"]), str(r["steps"]), _fmt(r["step_ms_median"]),
                  _fmt(r["step_ms_p90"]), _fmt(r["device_ms_median"]))
    Console().print(t)


def run(args) -> int:
    from gearshift.engine_args import engine_kwargs

    require_extras("rich")
    kw = engine_kwargs(args)  # checked before torch loads
    from gearshift import LLM

    if args.batch_sizes and args.max_num_seqs is None:
        kw["max_num_seqs"] = max(args.batch_sizes)
    llm = LLM(**kw)
    if args.batch_sizes:
        result = {"input_len": args.input_len, "output_len": args.output_len,
                  "decode_by_batch": decode_table(llm, args.batch_sizes, input_len=args.input_len,
                                                  output_len=args.output_len, seed=args.seed)}
    else:
        profile = None
        if args.profile_steps:
            profile = (args.profile_steps[0], args.profile_steps[1], args.profile_out)
        result = run_offline(llm, num_prompts=args.num_prompts, input_len=args.input_len,
                             output_len=args.output_len, seed=args.seed,
                             temperature=args.temperature, profile=profile)
    result["env"] = environment(llm)
    result["engine_stats"] = {k: v for k, v in llm.engine.stats().items() if k != "spec"}
    if llm.engine.spec is not None:  # a draft at policy off never proposes: proposed stays 0
        result["spec"] = llm.engine.spec_stats()
    if llm.engine.config.device.startswith("cuda"):
        from gearshift.kernels.skinny_select import CHOOSER

        result["skinny_gemm"] = {"mode": CHOOSER.mode, "shapes": CHOOSER.report()}
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=1)
    (print_decode_table if args.batch_sizes else print_table)(result)
    return 0


def _batch_sizes(text: str) -> list[int]:
    import argparse

    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes >= 1 like 1,32,128, got {text!r}")
    return sizes


def add_args(p) -> None:
    from gearshift.engine_args import add_engine_args

    add_engine_args(p)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--batch-sizes", type=_batch_sizes, default=None,
                   help="decode table instead of throughput: median full-batch decode step per "
                        "batch size, e.g. 1,32,128 (--max-num-seqs defaults to the largest)")
    p.add_argument("--output-json", default="bench_offline.json")
    p.add_argument("--profile-steps", type=int, nargs=2, metavar=("FIRST", "COUNT"),
                   help="run timed steps FIRST..FIRST+COUNT-1 under torch.profiler (slows them)")
    p.add_argument("--profile-out", default="bench_offline_profile.txt")


if __name__ == "__main__":  # python -m gearshift.bench.offline ... (same flags as the CLI)
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="gearshift bench offline")
    add_args(parser)
    sys.exit(run(parser.parse_args()))
