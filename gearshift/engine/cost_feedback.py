"""What each step cost, fed back to the speculation policy (goodput's step-time model).

    VERIFY step     planning + wall time (synchronous: host work, drafting, the device),
                    less the draft's catch-up over the rows the plan stated
                    (plan.draft_catch_up: the price of the plain steps before it, which
                    the policy priced per row when it chose K, and learns here per row);
                    observed inside the NEXT VERIFY step, before its sync, not on the host
                    path between the two (`defer` / `flush`); not with prefill chunks
                    riding along (their prefill is no gear's cost)
    DECODE step     overlapped: its device time once its tokens are read (its wall time is
                    the wait for the step before it); synchronous: its wall time
    EXTEND step     not observed (goodput prices decode gears only)

A VERIFY step whose drafts all came from suffix decoding (a hybrid's) ran no draft pass:
it goes to policy.observe_model_free.

A step that captured a CUDA graph is not observed: a one-off capture would teach the
policy that its gear costs seconds.

Data flow: Engine.step -> CostFeedback.after_step / after_read -> policy.observe(gear, bs,
context, ms[, ks=K per request of a chain step mixing K]) and policy.observe_catch_up(rows, ms).
"""

from __future__ import annotations

from gearshift.forward_batch import ForwardMode
from gearshift.scheduler.plan import StepPlan


class CostFeedback:
    def __init__(self, scheduler, spec, num_graphs) -> None:
        self.scheduler, self.spec = scheduler, spec
        self.num_graphs = num_graphs  # () -> CUDA graphs captured so far
        self._graphs_seen = num_graphs()
        self._deferred: tuple | None = None  # (policy, plan, gear, ms) to observe

    def after_step(self, plan: StepPlan, wall_ms: float, timed: bool = True) -> None:
        """Right after a step (its wall time in `wall_ms` when `timed`)."""
        captured, self._graphs_seen = self._graphs_seen, self.num_graphs()
        if self.spec is None or plan.mode is ForwardMode.EXTEND or captured != self._graphs_seen \
                or not timed:
            return
        policy = self.scheduler.policy
        if plan.mode is ForwardMode.VERIFY:
            catch_up = self.spec.follow.catch_up_ms()  # the plain steps' price, not this K's
            if catch_up > 0:  # what leaving K = 0 costs per row
                policy.observe_catch_up(sum(plan.draft_catch_up), catch_up)
            # the next plan's scores were prepared before this step's sync anyway; a step
            # with prefill chunks riding along prices those chunks, not its K
            if all(plan.decoding):
                self._deferred = (policy, plan, self.spec.gear(plan), wall_ms - catch_up)
            return
        self._observe(policy, plan, self.spec.gear(plan), wall_ms)

    def after_read(self, plan: StepPlan, device_ms: float | None) -> None:
        """An overlapped DECODE step's tokens were read: its device time is its cost (host
        work hides behind the device)."""
        if self.spec is not None and device_ms and plan.mode is ForwardMode.DECODE:
            self._observe(self.scheduler.policy, plan, 0, device_ms)

    def flush(self) -> None:
        """Observe a deferred VERIFY step's cost, by the policy that ran it."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._observe(*deferred)

    @staticmethod
    def _observe(policy, plan: StepPlan, gear: int, ms: float) -> None:
        ctx = sum(r.num_tokens for r in plan.reqs)
        mixed = gear and plan.draft_topk == 1 and len(set(plan.draft_lens)) > 1
        ks = plan.draft_lens if mixed else None
        if gear and plan.model_free:
            policy.observe_model_free(gear, plan.batch_size, ctx, ms, ks)  # no draft pass
        elif mixed:
            policy.observe(gear, plan.batch_size, ctx, ms, ks=ks)  # mixed K
        else:
            policy.observe(gear, plan.batch_size, ctx, ms)
