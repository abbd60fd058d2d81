"""Commit: apply one step's result to its requests (the Scheduler's second entry point).

Per request: free the draft's scratch slots, keep the accepted nodes' slots in position
order and free the rest (rollback by count), write the new tokens from the output index
the step planned (a booked plain step's placeholder, else the end of the output; a
request's grammar accepts each), finish on EOS / stop ids / length / a grammar that
ended. Every mode takes this one body. A request whose commit raises fails alone; the step
goes on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gearshift.request import Request
from gearshift.scheduler.kv_pool import SlotPool
from gearshift.scheduler.plan import StepPlan, StepResult


@dataclass(slots=True)
class StepOutput:
    """What one step did to one request; consumed by OutputProcessor and the server."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "length" | "stop" | "abort" | "error" | None
    # (proposed, accepted, verify steps, K histogram) so far, when speculation is on
    spec: tuple | None = None
    error: str | None = None  # finish_reason "error": what failed while processing it
    cached_tokens: int = 0  # prompt tokens the prefix cache served this request
    # set by the engine for requests that ask (engine/logprob_outputs.py): TokenLogprob per
    # new token; the prompt's (None first) on the request's first output
    logprobs: list | None = None
    prompt_logprobs: list | None = None


class Committer:
    """The commit half of Scheduler (scheduler.py holds the requests, planning and release)."""

    slots: SlotPool
    running: list[Request]
    waiting: deque[Request]
    max_model_len: int

    if TYPE_CHECKING:  # defined by Scheduler
        def fail(self, req: Request, error: str) -> StepOutput: ...
        def _finish(self, req: Request, reason: str | None) -> None: ...
        def _spec_counts(self, req: Request) -> tuple | None: ...

    def commit(self, plan: StepPlan, result: StepResult) -> list[StepOutput]:
        """Apply one step's result: the one place where a step's slots are kept or freed
        and its tokens reach the requests (see the module doc)."""
        outputs: list[StepOutput] = []
        for i, req in enumerate(plan.reqs):
            nodes = plan.num_nodes[i] if plan.num_nodes else plan.extend_lens[i]
            self.slots.free(result.slots[i][nodes:])  # the draft's scratch
            try:
                out = self._commit_one(plan, result, i, req, nodes)
            except Exception as e:  # noqa: BLE001 - this request fails, the step goes on
                out = self.fail(req, f"{type(e).__name__}: {e}")
            if out is not None:
                out.cached_tokens = req.num_cached_tokens
                outputs.append(out)
        return outputs

    def _commit_one(self, plan: StepPlan, result: StepResult, i: int, req: Request,
                    nodes: int) -> StepOutput | None:
        """One body for every step: a booked (plain) step's token fills the placeholder it
        stood in as; a VERIFY step's tokens follow the committed output. A request finishing
        here may already be in a later launched step: its placeholders there are dropped
        and that step's token ignored."""
        at = plan.placeholders[i] if plan.placeholders else -1
        if at >= 0:
            req.num_pending -= 1
        if req.is_finished and not req.closing:
            return None  # aborted, or finished by an earlier token: its slots go with it
        if result.kept is not None:
            self._rollback(req, plan.prefix_lens[i], nodes, result.kept[i])
        tokens = result.tokens[i]
        if not tokens:  # a prefill chunk that does not reach the end of the prompt
            return None
        return self._write(req, tokens, at if at >= 0 else len(req.output_token_ids))

    def _write(self, req: Request, tokens: list[int], at: int) -> StepOutput:
        """The step's tokens into req's output from index `at` (its placeholder, or the end),
        each accepted by its grammar, up to the first that finishes the request."""
        if req.params.max_tokens == 0:
            del req.output_token_ids[at:]
            return self._prompt_only(req)
        out, reason = req.output_token_ids, None
        for j, tok in enumerate(tokens):
            if req.grammar is not None:  # raises for a token the grammar refuses
                req.grammar.accept(tok)
            if at + j < len(out):
                out[at + j] = tok
            else:
                out.append(tok)
            reason = self._stop_reason(req, tok) or (
                "length" if at + j + 1 >= req.params.max_tokens
                or len(req.prompt_token_ids) + at + j + 1 >= self.max_model_len else None)
            if reason is not None:
                tokens = tokens[:j + 1]
                del out[at + j + 1:]  # placeholders of steps already launched
                self._leave(req, reason)
                break
        return StepOutput(req.request_id, list(tokens), reason is not None, reason,
                          self._spec_counts(req))

    def _rollback(self, req: Request, prefix: int, nodes: int, kept: list[int]) -> None:
        """A VERIFY step's nodes sit at req.slots[prefix:]: keep the accepted ones in position
        order, free the rest."""
        tail = req.slots[prefix:]
        assert len(tail) == nodes, f"{req.request_id}: {len(tail)} node slots, planned {nodes}"
        keep = set(kept)
        self.slots.free([s for j, s in enumerate(tail) if j not in keep])
        req.slots[prefix:] = [tail[j] for j in kept]
        req.num_computed_tokens = prefix + len(kept)

    def _leave(self, req: Request, reason: str) -> None:
        """The request finishes: out of the batch (or the queue, preempted with a token in
        flight), its row and slots go back."""
        req.closing = False
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._finish(req, reason)

    def _prompt_only(self, req: Request) -> StepOutput:
        """A request for its prompt alone (max_tokens 0: scored for its logprobs) ends once
        the prompt is computed; the token sampled at its end is dropped."""
        self._leave(req, "length")
        return StepOutput(req.request_id, [], True, "length", self._spec_counts(req))

    @staticmethod
    def _stop_reason(req: Request, tok: int) -> str | None:
        p = req.params
        if not p.ignore_eos and tok in req.eos_token_ids:
            return "stop"
        if req.grammar is not None and req.grammar.terminated:  # it ended (EOS, ignore_eos too)
            return "stop"
        if p.stop_token_ids and tok in p.stop_token_ids:
            return "stop"
        return None
