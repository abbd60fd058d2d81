"""The two checks of benchmarks/h200_tp.sh that are not benches: a verdict each, in JSON.

    greedy   one engine with the EAGLE-3 head under the goodput policy: greedy outputs of
             prompts run one at a time (goodput drafts) and all together (goodput's own
             mix), then the same prompts at policy off (plain decoding) on the same engine:
             equal token for token? Runs under torchrun too (the TP=1 distributed path).
    fault    `gearshift serve -tp N`, several streamed requests, rank N-1 killed mid-load:
             the server must exit non-zero within seconds, every stream end (no hang)

Usage: python benchmarks/tp_checks.py {greedy,fault} --help

Data flow: h200_tp.sh -> this -> OUT/{greedy_tp,fault_tp}.json -> benchmarks/tp_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def greedy(args) -> int:
    from gearshift import LLM, SamplingParams
    from gearshift.bench.sweep import make_prompts
    from gearshift.policy.static import OffPolicy

    llm = LLM(args.model, speculative_algorithm="eagle3", draft_model=args.draft_model,
              tensor_parallel_size=args.tp, device=args.device, dtype=args.dtype,
              max_num_seqs=args.num_prompts, spec_policy="goodput")
    prompts = make_prompts(llm.tokenizer, llm.engine.model_config.vocab_size, args.num_prompts,
                           args.input_len, seed=0)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    solo = [llm.generate([p], params, use_tqdm=False)[0].token_ids
            for p in prompts[:args.solo]]
    together = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    spec = llm.spec_stats()
    llm.engine.set_policy(OffPolicy())
    plain = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    differ = [{"prompt": i, "run": run, "first_differing_token": next(
                  j for j, (a, b) in enumerate(zip(out, plain[i])) if a != b)}
              for run, outs in (("solo", solo), ("together", together))
              for i, out in enumerate(outs) if out != plain[i]]
    result = {"tensor_parallel_size": args.tp, "dtype": args.dtype,
              "prompts": len(prompts), "solo": len(solo), "output_len": args.output_len,
              "proposed": spec["proposed"], "accepted": spec["accepted"],
              "steps_by_k": spec["steps_by_k"], "equal": not differ, "differ": differ}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"goodput vs plain, greedy, TP={args.tp} {args.dtype}: "
          f"{len(solo) + len(together) - len(differ)} of {len(solo) + len(together)} outputs "
          f"equal; {spec['proposed']} drafts proposed, {spec['accepted']} accepted")
    return 0 if not differ and spec["proposed"] > 0 else 1


def fault(args) -> int:
    import httpx

    from gearshift.server.background import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "gearshift.cli", "serve", *args.engine_args, "--port", str(port),
           "-tp", str(args.tp), "--served-model-name", "m"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    if proc.poll() is not None or time.monotonic() >= deadline:
        proc.kill()
        print("the server did not start:", proc.communicate()[1][-3000:], file=sys.stderr)
        return 1
    ended: list[str] = []

    def stream(i: int) -> None:  # a long streamed completion; how it ended
        body = {"model": "m", "prompt": f"request {i}:", "max_tokens": args.max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=None) as r:
                for _ in r.iter_lines():
                    pass
            ended.append("closed")
        except httpx.HTTPError as e:
            ended.append(type(e).__name__)

    threads = [threading.Thread(target=stream, args=(i,), daemon=True)
               for i in range(args.requests)]
    for t in threads:
        t.start()
    time.sleep(args.kill_after)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    killed = int(children[-1])
    os.kill(killed, signal.SIGKILL)
    t0 = time.monotonic()
    health = []
    while proc.poll() is None and time.monotonic() - t0 < args.exit_timeout:
        try:
            health.append(httpx.get(base + "/health", timeout=1).status_code)
        except httpx.HTTPError:
            health.append(None)
        time.sleep(0.2)
    exit_s = time.monotonic() - t0
    if proc.poll() is None:
        proc.kill()
    for t in threads:
        t.join(timeout=5)
    err = proc.communicate()[1]
    result = {"tensor_parallel_size": args.tp, "requests": args.requests, "killed_pid": killed,
              "exit_code": proc.returncode, "seconds_to_exit": round(exit_s, 2),
              "health_after_kill": sorted({str(h) for h in health}),
              "streams_ended": len(ended), "stream_endings": sorted(set(ended)),
              "rank_named": f"rank {args.tp - 1}" in err}
    ok = (proc.returncode not in (0, None) and exit_s < args.exit_timeout
          and len(ended) == args.requests)
    result["ok"] = ok
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"rank {args.tp - 1} killed under load: the server exited with code "
          f"{proc.returncode} after {exit_s:.1f} s; {len(ended)} of {args.requests} streams "
          f"ended ({', '.join(sorted(set(ended)))})")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(prog="tp_checks.py")
    sub = p.add_subparsers(dest="check", required=True)
    g = sub.add_parser("greedy", help="goodput's greedy outputs == plain decoding's")
    g.add_argument("--model", required=True)
    g.add_argument("--draft-model", required=True)
    g.add_argument("--tp", type=int, default=2)
    g.add_argument("--device", default="cuda")
    g.add_argument("--dtype", default="float32",
                   help="float32 (default): token flips at bf16 near-ties are no verdict on "
                        "losslessness")
    g.add_argument("--num-prompts", type=int, default=64)
    g.add_argument("--solo", type=int, default=8, help="of them, run one at a time first")
    g.add_argument("--input-len", type=int, default=128)
    g.add_argument("--output-len", type=int, default=128)
    g.add_argument("--out", required=True)
    f = sub.add_parser("fault", help="a rank killed under load ends the server")
    f.add_argument("--tp", type=int, default=2)
    f.add_argument("--requests", type=int, default=16)
    f.add_argument("--max-tokens", type=int, default=4096)
    f.add_argument("--kill-after", type=float, default=3.0, help="seconds of load first")
    f.add_argument("--start-timeout", type=float, default=300.0)
    f.add_argument("--exit-timeout", type=float, default=30.0)
    f.add_argument("--out", required=True)
    f.add_argument("engine_args", nargs=argparse.REMAINDER,
                   help="after --: the serve command's engine flags (model, device, ...)")
    args = p.parse_args()
    if args.check == "fault":
        args.engine_args = [a for a in args.engine_args if a != "--"]
    return greedy(args) if args.check == "greedy" else fault(args)


if __name__ == "__main__":
    sys.exit(main())
