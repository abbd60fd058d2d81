"""Log-probabilities onto a step's outputs, once its tokens are on the host: each output
gets those of the tokens it emitted (a VERIFY step computes the whole accepted path; a stop
may emit fewer), and a request's first output also carries its prompt's (None first).

Data flow: Engine (after Scheduler.commit) -> attach(plan, StepBatch.logprobs, outputs) ->
StepOutput.logprobs / .prompt_logprobs -> OutputProcessor -> RequestOutput, server.
"""

from __future__ import annotations

from gearshift.runner.logprobs import LogprobPlan
from gearshift.scheduler.plan import StepPlan
from gearshift.scheduler.scheduler import StepOutput


def attach(plan: StepPlan, lp: LogprobPlan | None, outputs: list[StepOutput]) -> None:
    if lp is None:
        return
    sampled = lp.read(plan.reqs)
    by_id = {o.request_id: o for o in outputs}
    for i, req in enumerate(plan.reqs):
        out = by_id.get(req.request_id)
        if out is None:
            continue
        if i in sampled:
            out.logprobs = sampled[i][: len(out.new_token_ids)]
        if req.params.prompt_logprobs is not None and not req.prompt_logprobs_sent:
            out.prompt_logprobs = [None, *(req.prompt_logprobs or [])]
            req.prompt_logprobs_sent = True
