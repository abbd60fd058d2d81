"""CostFeedback: which of the policy's hooks a step's time goes to. A VERIFY step whose
drafts all came from suffix decoding ran no model draft pass: observe_model_free.

Data flow (tests only): StepPlan -> CostFeedback._observe -> a recording policy.
"""

from __future__ import annotations

from gearshift.engine.cost_feedback import CostFeedback
from gearshift.forward_batch import ForwardMode
from gearshift.request import Request, SamplingParams
from gearshift.scheduler.plan import StepPlan


class Recorder:
    def __init__(self) -> None:
        self.seen = []

    def observe(self, k, bs, ctx_tokens, ms, ks=None) -> None:
        self.seen.append(("observe", k, ks))

    def observe_model_free(self, k, bs, ctx_tokens, ms, ks=None) -> None:
        self.seen.append(("model_free", k, ks))


def verify_plan(proposers: list[str], ks: list[int]) -> StepPlan:
    reqs = [Request(str(i), [1, 2, 3], SamplingParams(), 0) for i in range(len(ks))]
    return StepPlan(ForwardMode.VERIFY, reqs=reqs, decoding=[True] * len(ks), draft_lens=ks,
                    proposers=proposers)


def test_steps_without_model_drafts_go_to_their_own_hook():
    policy = Recorder()
    CostFeedback._observe(policy, verify_plan(["suffix", ""], [6, 0]), 3, 9.0)
    CostFeedback._observe(policy, verify_plan(["suffix", "eagle3"], [6, 2]), 4, 9.0)
    CostFeedback._observe(policy, verify_plan(["eagle3", "eagle3"], [2, 2]), 2, 9.0)
    CostFeedback._observe(policy, verify_plan([], [2, 2]), 2, 9.0)  # one proposer's engine
    assert policy.seen == [("model_free", 3, [6, 0]), ("observe", 4, [6, 2]),
                           ("observe", 2, None), ("observe", 2, None)]
