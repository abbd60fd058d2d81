"""`gearshift bench offline|serve` registration (the benchmarks live beside this file)."""

from __future__ import annotations


def register(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks: offline engine throughput, live server")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    from gearshift.bench import offline

    p = bsub.add_parser("offline", help="engine throughput and step time on synthetic prompts")
    offline.add_args(p)
    p.set_defaults(func=offline.run)
    from gearshift.bench.serve import add_serve_bench_args, run_serve_bench

    p = bsub.add_parser("serve", help="load a running server with an async client")
    add_serve_bench_args(p)
    p.set_defaults(func=run_serve_bench)
