"""`gearshift bench offline`: throughput and per-step time of the engine on synthetic
prompts (random token ids, fixed lengths, ignore_eos), printed as a table and saved as JSON.

Data flow: args -> LLM -> Engine.add_request x N -> Engine.step() loop timed per step
(each step ends in its one host sync, so wall time per step is the device time).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from datetime import UTC, datetime

import torch
from tqdm.auto import tqdm

from gearshift.request import SamplingParams


def synthetic_prompts(n: int, input_len: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n, input_len), generator=g).tolist()


def run_offline(llm, *, num_prompts: int, input_len: int, output_len: int, seed: int = 0,
                temperature: float = 0.0, warmup_steps: int = 3,
                profile: tuple[int, int, str] | None = None) -> dict:
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
    bar = tqdm(total=num_prompts * output_len, desc="bench offline", unit="tok")
    t_start = time.perf_counter()
    prof = None
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
    full_decode = [s["time_ms"] for s in steps if s["mode"] == "decode" and s["waiting_before"] == 0]
    out_tokens = num_prompts * output_len
    return {
        "num_prompts": num_prompts, "input_len": input_len, "output_len": output_len,
        "elapsed_s": elapsed, "output_tok_per_s": out_tokens / elapsed,
        "total_tok_per_s": num_prompts * (input_len + output_len) / elapsed,
        "steps": len(steps), "decode_steps": len(decode),
        "decode_step_ms_median": statistics.median(decode) if decode else None,
        "decode_step_ms_mean": statistics.fmean(decode) if decode else None,
        "decode_step_ms_p90": _pct(decode, 0.9),
        "decode_step_ms_median_no_queue": statistics.median(full_decode) if full_decode else None,
        "decode_device_ms_median": _median([s["device_ms"] for s in steps if s["mode"] == "decode"]),
        "extend_step_ms_median": _median([s["time_ms"] for s in steps if s["mode"] == "extend"]),
        "preemptions": engine.stats()["preemptions"],
        "graphs": engine.stats()["graphs"],  # graphed vs eager steps per mode
        "step_log": steps,
    }


def _start_profiler():
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    return prof


def _write_profile(prof, path: str, steps: list[dict]) -> None:
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


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def environment(llm) -> dict:
    cfg = llm.engine.config
    mc = llm.engine.model_config
    dev = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else platform.processor()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": dev, "torch": torch.__version__, "model": cfg.model,
        "load_format": cfg.load_format, "dtype": cfg.dtype,
        "attention_backend": cfg.attention_backend, "cuda_graphs": cfg.use_cuda_graphs,
        "overlap_schedule": cfg.overlap_schedule,
        "norms_in_gemms": llm.engine.runner.model.norms_folded,
        "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "kv_slots": llm.engine.memory_stats()["kv_slots_total"],
        "model_shape": {"layers": mc.num_layers, "hidden": mc.hidden_size, "heads": mc.num_heads,
                        "kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim,
                        "intermediate": mc.intermediate_size, "vocab": mc.vocab_size},
    }


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="gearshift bench offline")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key in ("num_prompts", "input_len", "output_len", "elapsed_s", "output_tok_per_s",
                "total_tok_per_s", "steps", "decode_steps", "decode_step_ms_median",
                "decode_step_ms_p90", "decode_step_ms_median_no_queue", "decode_device_ms_median",
                "extend_step_ms_median", "preemptions"):
        v = result[key]
        t.add_row(key, f"{v:.2f}" if isinstance(v, float) else str(v))
    Console().print(t)


def run(args) -> int:
    from gearshift import LLM
    from gearshift.engine_args import engine_kwargs

    llm = LLM(**engine_kwargs(args))
    profile = None
    if args.profile_steps:
        profile = (args.profile_steps[0], args.profile_steps[1], args.profile_out)
    result = run_offline(llm, num_prompts=args.num_prompts, input_len=args.input_len,
                         output_len=args.output_len, seed=args.seed, temperature=args.temperature,
                         profile=profile)
    result["env"] = environment(llm)
    if llm.engine.config.device.startswith("cuda"):
        from gearshift.kernels.skinny_select import CHOOSER

        result["skinny_gemm"] = {"mode": CHOOSER.mode, "shapes": CHOOSER.report()}
    print_table(result)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def add_args(p) -> None:
    from gearshift.engine_args import add_engine_args

    add_engine_args(p)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
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
