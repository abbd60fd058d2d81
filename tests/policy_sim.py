"""A closed loop of requests driven through a speculation policy with scripted step costs and
scripted acceptance, no model: the policy plans K, the "device" takes the scripted time,
each request accepts drafts with its own per-token probability, and the evidence goes
through the engine's own bookkeeping (speculative/acceptance.py) and the policy's observe().

Data flow: simulate(policy, phases, ...) -> plan -> scripted ms + accepted drafts ->
Acceptance.record / age, policy.observe -> tokens per ms per phase.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gearshift.policy.base import Policy, PolicyView
from gearshift.request import Request, SamplingParams
from gearshift.speculative.acceptance import Acceptance, age


@dataclass
class Phase:
    requests: int  # how many requests this phase runs through the loop
    alpha: float  # per-token acceptance of its requests' drafts


def cpu_like_ms(k: int, bs: int) -> float:
    """A CPU-like step: a plain step 8 ms + 0.5 ms a request; each draft token adds the
    draft's pass (1.5 ms) and its verification (0.25 ms a request)."""
    return 8.0 + 0.5 * bs + k * (1.5 + 0.25 * bs)


def simulate(policy: Policy, phases: list[Phase], concurrency: int, max_tokens: int = 64,
             step_ms=cpu_like_ms, num_draft_tokens: int = 4, seed: int = 0) -> list[dict]:
    """-> per phase: {"tok_per_ms", "verify_steps", "steps"}. A phase's requests enter as
    earlier ones finish (closed loop); a step's tokens count towards the phase of the
    request that committed them."""
    rng = random.Random(seed)
    acc = Acceptance(tree=False)
    queue = [(p, i) for p, ph in enumerate(phases) for i in range(ph.requests)]
    queue.reverse()
    running: list[tuple[Request, int]] = []
    out = [{"tokens": 0, "ms": 0.0, "verify_steps": 0, "steps": 0} for _ in phases]
    n = 0
    while queue or running:
        while queue and len(running) < concurrency:
            p, _ = queue.pop()
            n += 1
            req = Request(f"r{n}", [1] * 16, SamplingParams(max_tokens=max_tokens), 0)
            running.append((req, p))
        reqs = [r for r, _ in running]
        view = PolicyView(reqs, len(queue), num_draft_tokens, acc.population())
        ks = policy.plan(view)
        k = max(ks)
        ms = step_ms(k, len(reqs))
        phase_of_step = {p for _, p in running}
        for (req, p), ki in zip(running, ks):
            got = 0
            while got < ki and rng.random() < phases[p].alpha:
                got += 1
            if ki:
                acc.record(req, ki, 1, ki, got)
            else:
                age(req)
            req.output_token_ids += [0] * (got + 1)
            out[p]["tokens"] += got + 1
        if not k:
            acc.age_population(0, len(reqs))  # sampled requests
        policy.observe(k, len(reqs), sum(r.num_tokens for r in reqs), ms,
                       ks=ks if k and len(set(ks)) > 1 else None)
        for p in phase_of_step:  # the step's time goes to every phase it served
            out[p]["ms"] += ms / len(phase_of_step)
            out[p]["steps"] += 1
            out[p]["verify_steps"] += bool(k)
        running = [(r, p) for r, p in running if len(r.output_token_ids) < max_tokens]
    for o in out:
        o["tok_per_ms"] = o["tokens"] / o["ms"] if o["ms"] else 0.0
    return out
