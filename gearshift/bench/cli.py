"""`gearshift bench offline|serve` registration (the benchmarks live beside this file)."""

from __future__ import annotations


def register(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks: offline engine throughput, live server")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    from gearshift.bench import offline

    p = bsub.add_parser("offline", help="engine throughput and step time on synthetic prompts")
    offline.add_args(p)
    p.set_defaults(func=offline.run)
    from gearshift.bench import spec_costs, sweep
    from gearshift.bench.serve import add_serve_bench_args, run_serve_bench

    p = bsub.add_parser("spec-costs", help="decode vs verify vs draft-step device time (batch 1)")
    spec_costs.add_args(p)
    p.set_defaults(func=spec_costs.run)
    p = bsub.add_parser("sweep", help="throughput vs concurrency for each speculation policy")
    sweep.add_args(p)
    p.set_defaults(func=sweep.run)
    from gearshift.bench import burst, spec_tax

    p = bsub.add_parser("spec-tax", help="decode step: no draft vs draft configured, policy off")
    spec_tax.add_tax_args(p)
    p.set_defaults(func=spec_tax.run_tax)
    p = bsub.add_parser("burst", help="probe acceptance after a burst pushed speculation to K=0")
    burst.add_burst_args(p)
    p.set_defaults(func=burst.run_burst)

    from gearshift.bench import pair

    p = bsub.add_parser("pair", help="widened bench pair vs small pair: cost, tokens, acceptance")
    pair.add_args(p)
    p.set_defaults(func=pair.run)

    p = bsub.add_parser("serve", help="load a running server with an async client")
    add_serve_bench_args(p)
    p.set_defaults(func=run_serve_bench)
