"""`gearshift bench offline|sweep|serve|soak` registration (the benchmarks live beside this
file; each imports its heavy dependencies only when it runs).

Data flow: gearshift/cli.py -> register(sub) -> the bench's add_args / run.
"""

from __future__ import annotations


def register(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks: engine throughput, decode step, speculation "
                                          "sweep, live server load and soak")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    from gearshift.bench import offline, soak, sweep
    from gearshift.bench.serve import add_serve_bench_args, run_serve_bench

    p = bsub.add_parser("offline", help="engine throughput on synthetic prompts, or the decode "
                                        "step by batch size (--batch-sizes)")
    offline.add_args(p)
    p.set_defaults(func=offline.run)
    p = bsub.add_parser("sweep", help="throughput vs concurrency for each speculation policy")
    sweep.add_args(p)
    p.set_defaults(func=sweep.run)
    p = bsub.add_parser("serve", help="load a running server with an async client")
    add_serve_bench_args(p)
    p.set_defaults(func=run_serve_bench)
    p = bsub.add_parser("soak", help="bounded soak of an in-process server on loopback: random "
                                     "requests, disconnects, malformed bodies; no 5xx, no leak")
    soak.add_args(p)
    p.set_defaults(func=soak.run)
