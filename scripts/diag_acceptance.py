"""Does EAGLE-3 acceptance depend on how many requests run together? (GPU diagnostic)

The same held-out prompts, greedy, chain K (spec_policy "always"), run one at a time and
then all together, with CUDA graphs and without. Acceptance must not depend on the batch
(each request's draft sees only its own context); a drop with concurrency is a bug in a
batched or graphed draft path. Prints one JSON object (also written to --out).

Usage:
    python scripts/diag_acceptance.py --model /tmp/big --draft-model /tmp/bighead --out a.json
"""

from __future__ import annotations

import argparse
import json
import time

from gearshift import LLM, SamplingParams
from gearshift.bench.sweep import make_prompts


def delta(before: dict, after: dict, k: int) -> dict:
    hist = {k: v - before["accept_len_hist"].get(k, 0) for k, v in after["accept_len_hist"].items()}
    proposed = after["proposed"] - before["proposed"]
    accepted = after["accepted"] - before["accepted"]
    steps = sum(hist.values())
    # P(depth d accepted | depth d-1 accepted), d = 1..K
    at_least = [sum(v for n, v in hist.items() if n >= d) for d in range(k + 1)]
    depth = [round(at_least[d] / at_least[d - 1], 4) if at_least[d - 1] else None
             for d in range(1, k + 1)]
    return {"proposed": proposed, "accepted": accepted, "verify_steps": steps,
            "acceptance": round(accepted / proposed, 4) if proposed else None,
            "accept_len_hist": dict(sorted(hist.items())), "per_depth": depth}


def run(llm: LLM, prompts: list[list[int]], together: bool, max_tokens: int,
        k: int) -> tuple[dict, list]:
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    before = llm.spec_stats()
    t0 = time.perf_counter()
    if together:
        outs = llm.generate(prompts, sp)
    else:
        outs = [llm.generate([p], sp)[0] for p in prompts]
    res = delta(before, llm.spec_stats(), k)
    res["elapsed_s"] = round(time.perf_counter() - t0, 3)
    return res, [o.token_ids for o in outs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--draft-model", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--variants", default="graphs,eager")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    report: dict = {"args": vars(args)}
    tokens: dict = {}
    for variant in args.variants.split(","):
        llm = LLM(args.model, dtype=args.dtype, max_num_seqs=args.num_prompts,
                  speculative_algorithm="eagle3", draft_model=args.draft_model,
                  num_draft_tokens=args.k, spec_policy="always",
                  cuda_graphs=variant != "eager", overlap_schedule=variant != "no-overlap")
        prompts = make_prompts(llm.tokenizer, llm.engine.model_config.vocab_size,
                               args.num_prompts, args.input_len, 0)
        for mode in ("alone", "together"):
            res, toks = run(llm, prompts, mode == "together", args.output_len, args.k)
            tokens[(variant, mode)] = toks
            report[f"{variant}/{mode}"] = res
            print(variant, mode, json.dumps(res), flush=True)
        del llm
    ref = tokens.get(("graphs", "alone")) or next(iter(tokens.values()))
    report["same_tokens_as_first"] = {f"{v}/{m}": sum(a == b for a, b in zip(t, ref))
                                      for (v, m), t in tokens.items()}
    print(json.dumps(report["same_tokens_as_first"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
