"""BatchBuilder.prepare(plan): allocate exactly the KV slots the plan counts
(`StepPlan.num_slots`: a VERIFY step's draft nodes and scratch included), then build the
step's device batch, laid out for the plan's `Layout` (runner/layout.py), in one
host-to-device copy: every mode, a VERIFY step's target pass included, with rows
reserved for the drafts the proposer writes on the device (runner/verify_layout.py).
The only place where a step's slots are allocated; Scheduler.commit keeps or frees them.

Data flow: Scheduler.schedule() -> StepPlan (+ its Layout) -> prepare() -> StepBatch ->
ModelRunner.forward (plain steps) or SpecRunner.run (VERIFY: the draft fills its rows,
then ModelRunner.forward). `extend_batch()` builds the extend layout over slots a
request already owns (no allocation): the draft's catch-up and draft-extend use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gearshift.attention.base import KVCache
from gearshift.faults import RequestFault
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.request import Request
from gearshift.runner.logprobs import logprob_plan, plan_logprobs
from gearshift.runner.penalties import penalty_batch, stage_penalties
from gearshift.runner.sampler import SamplingBatch
from gearshift.runner.staging import Stager, forward_batch, pad_batch, stage_forward
from gearshift.runner.verify_layout import VerifyPass, stage_verify, verify_pass
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import Layout, StepPlan
from gearshift.structured.mask import GrammarBatch
from gearshift.structured.matcher import step_masks


def stage_sampling(st: Stager, reqs: list[Request], pad: int,
                   steps: list[int] | None = None) -> tuple[bool, bool]:
    """Per-row sampling parameters; `steps`: the output index each row samples (the seeded
    draw is keyed by it), by default the next one. -> (some request processes its logits
    (penalties, bias, min_tokens), some request wants logprobs)."""
    temps, top_p, top_k, seeds = [], [], [], []
    processes = logprobs = False
    for req in reqs:
        p = req.params
        temps.append(p.temperature)
        top_p.append(p.top_p)
        top_k.append(p.top_k)
        seeds.append(req.sampling_seed)
        processes = processes or req.processes_logits
        logprobs = logprobs or req.wants_logprobs
    if steps is None:
        steps = [len(req.output_token_ids) for req in reqs]
    st.add_floats("temperatures", temps + [0.0] * pad)
    st.add_floats("top_p", top_p + [1.0] * pad)
    st.add_ints("top_k", top_k + [-1] * pad)
    st.add_ints("seeds", seeds + [0] * pad)
    st.add_ints("steps", steps + [0] * pad)
    return processes, logprobs


def stage_extras(st: Stager, plan: StepPlan, flags: tuple[bool, bool], pad: int,
                 fresh: list[bool]):
    """Penalties and logprob positions of the requests that use them (nothing otherwise).
    -> what plan_logprobs planned, for logprob_plan."""
    processes, logprobs = flags
    if processes:
        stage_penalties(st, plan.reqs, pad, plan.sample, fresh)
    if logprobs:
        return plan_logprobs(st, plan.reqs, plan.prefix_lens, plan.extend_lens, plan.sample)
    return None


def sampling_batch(d: dict[str, torch.Tensor], reqs: list[Request], planned=None,
                   masks: torch.Tensor | None = None) -> SamplingBatch:
    params = [r.params for r in reqs]
    grammar = None if masks is None else GrammarBatch(d["grammar"].view(masks.shape))
    return SamplingBatch(
        temperatures=d["temperatures"], top_p=d["top_p"], top_k=d["top_k"], seeds=d["seeds"],
        steps=d["steps"],
        all_greedy=all(p.temperature == 0.0 for p in params),
        any_greedy=any(p.temperature == 0.0 for p in params),
        need_top_k=any(p.top_k > 0 for p in params),
        need_top_p=any(p.top_p < 1.0 for p in params),
        penalties=penalty_batch(d, reqs), logprobs=logprob_plan(d, planned), grammar=grammar,
    )


@dataclass(slots=True)
class StepBatch:
    """The device side of one plan (written by BatchBuilder.prepare)."""

    slots: list[list[int]]  # per request, as allocated: its nodes, then the draft's scratch
    sampling: SamplingBatch  # per request (DECODE: padded to the graph's rows)
    layout: Layout  # the plan's
    forward: ForwardBatch | None  # every mode; VERIFY: the drafts' rows filled by
    #                              fill_drafts (None until lay_out_target)
    # VERIFY: roots [B] (pending tokens), prefix [B], rows [B], k [B], scratch [B * S] and
    # node_slots [B * N] (0-padded to the widest chain or tree; a chunk riding along is cut
    # to that width), in the same copy as `sampling`
    staged: dict[str, torch.Tensor] | None = None
    verify: VerifyPass | None = None  # VERIFY: what verification reads of the target pass
    target: Callable[[], tuple[ForwardBatch, VerifyPass]] | None = None  # VERIFY: its layout

    def lay_out_target(self) -> None:
        """A VERIFY step's target pass (`forward`, `verify`), staged in a copy of its own
        once the draft's pass is launched: its host work then runs while the device drafts
        instead of before anything is launched."""
        if self.target is not None:
            self.forward, self.verify = self.target()
            self.target = None


class BatchBuilder:
    def __init__(self, slots: SlotPool, rows: ReqRowPool, kv: KVCache, device: torch.device) -> None:
        self.slots, self.rows, self.kv = slots, rows, kv
        self.device = device

    def prepare(self, plan: StepPlan) -> StepBatch:
        """Slots and device tensors for `plan`, laid out for plan.layout (None: eager and
        unpadded). Every request's node slots join its slot list (positions prefix.. for
        plain steps and chains), so a request released mid-step frees them too. Each
        request's own inputs are read before anything is allocated: a failure there raises
        RequestFault for it alone."""
        verify = plan.mode is ForwardMode.VERIFY
        assert plan.layout is not None or not verify, "a VERIFY plan needs its layout"
        layout = plan.layout or Layout(plan.mode.value, plan.batch_size, plan.num_tokens)
        # plain: the step's input ids per request; VERIFY: the pending token (a chunk
        # riding along: its chunk)
        tokens = []
        constrained = False  # some request samples under a grammar
        for req, n, prefix, dec in zip(plan.reqs, plan.extend_lens, plan.prefix_lens,
                                       plan.decoding):
            try:
                tokens.append(req.token_slice(prefix, prefix + (1 if verify and dec else n)))
            except Exception as e:  # noqa: BLE001 - this request's fault, not the step's
                raise RequestFault(req, e) from e
            constrained = constrained or req.grammar is not None
        # the next token's masks (VERIFY: the pending position's, for the draft's first level)
        pad = layout.rows - plan.batch_size if plan.mode is ForwardMode.DECODE else 0
        masks = step_masks(plan.reqs, plan.sample, pad) if constrained else None
        fresh = [req.req_pool_index < 0 for req in plan.reqs]  # a row given out now
        cached = []  # new rows whose first tokens a prefix-cache hit already holds
        for req, prefix in zip(plan.reqs, plan.prefix_lens):
            if req.req_pool_index < 0:
                req.req_pool_index = self.rows.alloc()
                if prefix:
                    cached.append((req.req_pool_index, req.slots[:prefix]))
        if cached:
            self._record_cached(cached)
        slots = [self.slots.alloc(n) for n in plan.num_slots]
        nodes = plan.num_nodes or plan.extend_lens
        for req, s, n in zip(plan.reqs, slots, nodes):
            req.slots.extend(s[:n])
        if verify:
            return self._verify(plan, layout, slots, tokens, fresh, masks)
        return self._plain(plan, layout, slots, [t for ts in tokens for t in ts], fresh, masks)

    def _record_cached(self, cached: list[tuple[int, list[int]]]) -> None:
        """req_to_token rows of requests that start after a cached prefix: its slots."""
        st = Stager(self.device)
        st.add_ints("rows", [row for row, s in cached for _ in s])
        st.add_ints("pos", [p for _, s in cached for p in range(len(s))])
        st.add_int32("slots", [x for _, s in cached for x in s])
        d = st.to_device()
        self.kv.req_to_token[d["rows"], d["pos"]] = d["slots"]

    def _plain(self, plan: StepPlan, layout: Layout, slots: list[list[int]],
               input_ids: list[int], fresh: list[bool], masks: torch.Tensor | None) -> StepBatch:
        bs = plan.batch_size
        rows, prefix, extend, input_ids, out_loc = pad_batch(
            plan.mode, [r.req_pool_index for r in plan.reqs], plan.prefix_lens, plan.extend_lens,
            input_ids, [x for s in slots for x in s], layout)
        st = Stager(self.device)
        stage_forward(st, rows, prefix, extend, input_ids, out_loc, num_real=bs)
        # DECODE samples its padded rows (graph-sized); EXTEND samples the real ones only
        # the booked plan's placeholder is the output index its row samples
        steps = [i if i >= 0 else len(r.output_token_ids)
                 for r, i in zip(plan.reqs, plan.placeholders)] if plan.placeholders else None
        pad = len(rows) - bs if plan.mode is ForwardMode.DECODE else 0
        flags = stage_sampling(st, plan.reqs, pad, steps)
        planned = stage_extras(st, plan, flags, pad, fresh)
        if masks is not None:
            st.add_tensor("grammar", masks)
        d = st.to_device()
        fb = forward_batch(d, plan.mode, bs, prefix, extend, self.kv)
        if layout.graph is not None and plan.mode is ForwardMode.EXTEND:
            fb.max_extend_len = layout.tokens  # the grid bound: a constant of the graph shape
        assert fb.mode is ForwardMode.EXTEND or fb.num_tokens == fb.padded_batch_size, \
            "DECODE must carry one token per row"
        return StepBatch(slots, sampling_batch(d, plan.reqs, planned, masks), layout, fb)

    def _verify(self, plan: StepPlan, layout: Layout, slots: list[list[int]],
                tokens: list[list[int]], fresh: list[bool], masks: torch.Tensor | None
                ) -> StepBatch:
        """The inputs every stage of a VERIFY step reads, staged in one copy, and its target
        pass, laid out by StepBatch.lay_out_target. The pending token (a root) is usually
        the last sampled one, or the last prompt token when a chunked prefill ended with a
        1-token chunk."""
        reqs = plan.reqs
        roots = [t[0] for t in tokens]
        # node slots as wide as the widest chain or tree: a chunk riding along reads its
        # own from the host (its whole chunk, every row staged that wide, was host time)
        n_max = max(n for n, dec in zip(plan.num_nodes, plan.decoding) if dec)
        s_max = max(plan.num_scratch)
        st = Stager(self.device)
        st.add_ints("roots", roots)
        st.add_ints("prefix", plan.prefix_lens)
        st.add_ints("rows", [r.req_pool_index for r in reqs])
        st.add_ints("k", plan.draft_lens)
        st.add_ints("scratch", [x for s, n in zip(slots, plan.num_nodes)
                                for x in s[n:] + [0] * (s_max - len(s) + n)])
        st.add_ints("node_slots", [x for s, n in zip(slots, plan.num_nodes)
                                   for x in s[:min(n, n_max)] + [0] * (n_max - n)])
        planned = stage_extras(st, plan, stage_sampling(st, reqs, 0), 0, fresh)
        assert planned is None or not planned[2], "prompt logprobs ride in plain steps only"
        if masks is not None:
            st.add_tensor("grammar", masks)
        couples = [r.coupled and r.params.temperature > 0 for r in reqs]
        if any(couples):
            st.add_ints("coupled", [int(c) for c in couples])
        d = st.to_device()
        sb = sampling_batch(d, reqs, planned, masks)
        if any(couples):  # speculative/coupled.py
            sb.coupled = d["coupled"] != 0
            sb.all_coupled = all(c or r.params.temperature == 0 for c, r in zip(couples, reqs))
        riders = [[] if dec else t for t, dec in zip(tokens, plan.decoding)]

        def target() -> tuple[ForwardBatch, VerifyPass]:
            st = Stager(self.device)
            lists = stage_verify(st, plan, layout, slots, riders)
            d.update(st.to_device())
            return verify_pass(d, plan, layout, lists, self.kv)
        return StepBatch(slots, sb, layout, None, staged=d, target=target)

    def extend_batch(self, mode: ForwardMode, reqs: list[Request], prefix: list[int],
                     extend: list[int], input_ids: list[int], pad: int = 0) -> ForwardBatch:
        """An extend-layout batch over slots the requests already own (no allocation);
        `pad` one-token dummy rows (row 0, slot 0, position 0) follow the real ones."""
        out_loc: list[int] = []
        for req, p, n in zip(reqs, prefix, extend):
            out_loc.extend(req.slots[p:p + n])
        st = Stager(self.device)
        rows = [r.req_pool_index for r in reqs] + [0] * pad
        prefix, extend = prefix + [0] * pad, extend + [1] * pad
        stage_forward(st, rows, prefix, extend, input_ids + [0] * pad, out_loc + [0] * pad)
        return forward_batch(st.to_device(), mode, len(reqs), prefix, extend, None)
