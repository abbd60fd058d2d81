"""The engine of each rank under tensor parallelism: the same Engine everywhere (scheduler,
slot pools, prefix cache, runner over this rank's part of the model, speculative runner),
fed the same inputs, so every rank prepares, runs and commits the same plan. Rank 0 leads:

    LeaderEngine (rank 0)    the engine LLM and the server talk to: takes requests, runs the
                             policy, sends each step's Step message first (sync.py), returns
                             outputs; raises RankFailure once another rank is gone
    FollowerEngine (1..N-1)  serve(): receive, apply the events, step under ReplayPolicy,
                             check the plan's fingerprint; outputs are dropped

Data flow: distributed/launch.py builds them -> LLM / AsyncEngine call the leader -> its
Step messages (comm.Channel) -> every follower's serve() loop.
"""

from __future__ import annotations

import pickle

from gearshift.config import EngineConfig
from gearshift.distributed.sync import (
    Call,
    PlanMismatch,
    RecordingPolicy,
    ReplayPolicy,
    Shutdown,
    Step,
    fingerprint,
)
from gearshift.engine.engine import Engine
from gearshift.policy.base import Policy
from gearshift.scheduler.plan import StepPlan
from gearshift.scheduler.scheduler import StepOutput

__all__ = ["FollowerEngine", "LeaderEngine", "RankFailure"]


class RankFailure(RuntimeError):
    """Another rank died or raised: the engine cannot go on (its steps need every rank)."""


class LeaderEngine(Engine):
    def __init__(self, config: EngineConfig, group) -> None:
        self.group = group  # launch.Group: the ranks, their process groups and workers
        self._events: list[tuple] = []  # since the last message, in order
        super().__init__(config, group.tp)  # its speculation warm-up already sends steps

    def _create_policy(self) -> RecordingPolicy:
        return RecordingPolicy(super()._create_policy())

    def set_policy(self, policy: Policy) -> None:
        """Engine.set_policy, its answers recorded for the other ranks."""
        super().set_policy(policy if isinstance(policy, RecordingPolicy)
                           else RecordingPolicy(policy))

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt_token_ids: list[int], params) -> int:
        """Engine.add_request (-> the request's seed), sent to the other ranks."""
        self._check_ranks()
        seed = super().add_request(request_id, prompt_token_ids, params)
        # as it arrived (by the next message this step may have admitted it), without its
        # grammar matcher: each rank compiles its own from the params
        req = self.scheduler.waiting[-1]
        grammar, req.grammar = req.grammar, None
        try:
            self._events.append(("add", pickle.dumps(req)))
        finally:
            req.grammar = grammar
        return seed

    def abort_request(self, request_id: str, reason: str = "abort") -> None:
        super().abort_request(request_id, reason)
        self._events.append(("abort", request_id, reason))

    def reset_prefix_cache(self) -> int:
        freed = super().reset_prefix_cache()
        self._events.append(("reset_prefix_cache",))
        return freed

    def has_unfinished_requests(self) -> bool:
        self._check_ranks()  # the server's engine loop asks this at least once a second
        return super().has_unfinished_requests()

    # ------------------------------------------------------------------ the step
    def step(self, emit=None) -> list[StepOutput]:
        self._check_ranks()
        self.group.busy = True
        try:
            outputs = super().step(emit)
        except BaseException as e:
            self._raise_rank_failure(e)
            # rank 0 left the step halfway (an error of its own, KeyboardInterrupt): the
            # others wait inside it, so no later step can pair with theirs
            self.group.fail(f"rank 0 stopped inside a step ({type(e).__name__}: {e}); the "
                            "other ranks are out of step")
            raise
        finally:
            self.group.busy = False
        self._check_ranks()  # an aborted NCCL collective returns: its results are garbage
        return outputs

    def _schedule(self) -> StepPlan:
        policy: RecordingPolicy | None = self.scheduler.policy  # None: no draft
        plan = super()._schedule()
        self.group.channel.send(Step(self._take_events(), policy.take() if policy else [],
                                     bool(policy is not None and policy.drafts),
                                     fingerprint(plan)))
        return plan

    def prefill_logits(self, token_ids: list[int]):
        self._check_ranks()
        try:
            self.group.channel.send(Call(self._take_events(), "prefill_logits",
                                         (list(token_ids),)))
            return super().prefill_logits(token_ids)
        except BaseException as e:
            self._raise_rank_failure(e)
            self.group.fail(f"rank 0 stopped inside prefill_logits ({type(e).__name__})")
            raise

    def memory_stats(self) -> dict:
        k = self.runner.kv.k  # [layers, slots + 1, this rank's KV heads, head_dim]
        return {**super().memory_stats(), "tensor_parallel_size": self.group.size,
                "kv_heads_per_rank": k.shape[2], "kv_cache_bytes_per_rank": 2 * k.nbytes}

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the other ranks (after the message in hand) and release the groups."""
        self.group.goodbye(timeout)

    # ------------------------------------------------------------------ faults
    def _take_events(self) -> list[tuple]:
        events, self._events = self._events, []
        return events

    def _check_ranks(self) -> None:
        failure = self.group.failure()
        if failure is not None:
            raise RankFailure(failure)

    def _raise_rank_failure(self, cause: BaseException) -> None:
        """A collective failed or a message could not go out: name the rank that is gone,
        once the watcher has seen it exit (a closed socket can come a moment earlier)."""
        failure = self.group.failure(wait=5.0 if isinstance(cause, RuntimeError) else 0.0)
        if failure is not None:
            raise RankFailure(failure) from cause


class FollowerEngine(Engine):
    leads = False  # rank 0's warm-up runs here as the steps it sends
    CALLS = ("prefill_logits",)

    def __init__(self, config: EngineConfig, group) -> None:
        self.group = group
        self.replay: ReplayPolicy | None = None  # the policy, with a draft configured
        super().__init__(config, group.tp)
        self._expected: Step | None = None

    def _create_policy(self) -> ReplayPolicy:
        self.replay = ReplayPolicy()  # rank 0's answers, as each Step message brings them
        return self.replay

    def serve(self) -> None:
        """Run rank 0's messages until it sends Shutdown (or its connection closes)."""
        channel = self.group.channel
        while True:
            message = channel.recv()
            for event in message.events:
                self._apply(event)
            if isinstance(message, Step):
                self._expected = message
                self.step()
            elif isinstance(message, Call) and message.name in self.CALLS:
                getattr(self, message.name)(*message.args)
            elif isinstance(message, Shutdown):
                return
            else:
                raise PlanMismatch(f"unexpected message from rank 0: {message!r}")

    def _apply(self, event: tuple) -> None:
        kind = event[0]
        if kind == "add":
            req = pickle.loads(event[1])
            if req.params.structured_output is not None:
                req.grammar = self.grammars.grammar(req.params.structured_output)
            self.scheduler.add(req)
        elif kind == "abort":
            self.abort_request(event[1], event[2])
        elif kind == "reset_prefix_cache":
            self.reset_prefix_cache()
        else:
            raise PlanMismatch(f"unknown event from rank 0: {kind!r}")

    def _schedule(self) -> StepPlan:
        expected = self._expected
        if self.replay is not None:
            self.replay.load(expected.answers, expected.drafts)
        plan = super()._schedule()
        summary, digest = fingerprint(plan)
        unused = len(self.replay.answers) if self.replay is not None else len(expected.answers)
        if digest != expected.fingerprint[1] or unused:
            raise PlanMismatch(
                f"rank {self.group.rank} planned {summary}; rank 0 planned "
                f"{expected.fingerprint[0]}" + (f" ({unused} policy answer(s) unused)"
                                                if unused else ""))
        return plan
