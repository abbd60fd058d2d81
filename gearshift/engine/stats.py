"""The engine's counters: steps by mode, tokens, step time, and speculation's counters as
`spec_stats()` reports them.

Data flow: Engine.step -> StepStats.account(plan, outputs, ...) ; Engine.stats() /
spec_stats() -> LLM, the server's /metrics, benches.
"""

from __future__ import annotations

import logging

from gearshift.scheduler.plan import StepPlan
from gearshift.scheduler.scheduler import StepOutput

log = logging.getLogger("gearshift.engine")


class StepStats:
    def __init__(self) -> None:
        self.counts = {"steps": 0, "decode_steps": 0, "extend_steps": 0, "verify_steps": 0,
                       "tokens_computed": 0, "tokens_generated": 0, "step_time_s": 0.0}
        self.last_step: dict = {}  # mode, batch_size, num_tokens, time_s, device_ms, gear
        self.trace = None  # a StepTrace (--step-trace): one JSON line per step

    def account(self, plan: StepPlan, outputs: list[StepOutput], dt: float,
                device_ms: float | None, gear: int) -> None:
        s = self.counts
        s["steps"] += 1
        s[f"{plan.mode.value}_steps"] += 1
        s["tokens_computed"] += plan.num_tokens
        # gear: the cost model's key, 0 plain, K chains, the draft depth + 1 the tree
        self.last_step = {"mode": plan.mode.value, "batch_size": plan.batch_size,
                          "num_tokens": plan.num_tokens, "time_s": dt, "device_ms": device_ms,
                          "gear": gear}
        generated = sum(len(o.new_token_ids) for o in outputs)
        s["tokens_generated"] += generated
        if self.trace is not None:
            self.trace.record(plan, self.last_step, generated)
        s["step_time_s"] += dt
        log.debug("step %s bs=%d tokens=%d %.2fms", plan.mode.name, plan.batch_size,
                  plan.num_tokens, dt * 1e3)


def spec_stats(engine) -> dict:
    """Speculation counters: steps by K, proposed / accepted draft tokens, acceptance rate
    and the histogram of accepted lengths (empty without speculation)."""
    if engine.spec is None:
        return {}
    s = engine.spec.stats
    proposed, accepted = s["proposed"], s["accepted"]
    last = engine.last_step
    return {
        "algorithm": engine.config.speculative_algorithm, "policy": engine.config.spec_policy,
        # how sampled tokens are verified by default (requests may choose their own)
        "sampling": engine.config.spec_sampling,
        "steps_by_k": {int(k.split(".")[1]): v for k, v in s.items() if k.startswith("steps_by_k.")},
        # VERIFY steps whose requests drafted different non-zero K
        "mixed_k_steps": s["mixed_k_steps"],
        # request-steps that verified chains / draft trees (the plan's tree width)
        "chain_steps": s["chain_steps"], "tree_steps": s["tree_steps"],
        # drafts accepted on tree request-steps, and what their top-1 chains (the draft's
        # argmax path, what a chain step would have proposed) alone accepted there: the
        # measured gain of trees over chains on the same text
        "tree_accepted": s["tree_accepted"], "tree_top1_accepted": s["tree_top1_accepted"],
        "proposed": proposed, "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        # the draft's catch-ups over rows committed at K = 0 (the price of leaving K = 0)
        "catch_up_rows": s["catch_up_rows"], "catch_up_ms": s["catch_up_ms"],
        "accept_len_hist": {int(k.split(".")[1]): v for k, v in s.items()
                            if k.startswith("accept_len.")},
        # the proposer's own counters by its name (suffix decoding: drafts by source)
        # (a hybrid, "eagle3+suffix": per proposer its drafts, proposed and accepted tokens)
        "proposers": _proposer_counters(engine),
        "controller": dict(engine.policy.last_prediction,
                           **({"measured_ms": last.get("time_s", 0) * 1e3} if last else {})),
    }


def _proposer_counters(engine) -> dict:
    proposer = engine.spec.proposer
    if engine.config.hybrid:
        return proposer.counters()
    return {engine.config.speculative_algorithm: dict(getattr(proposer, "stats", None) or {})}
