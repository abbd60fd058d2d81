"""BatchBuilder.prepare(plan): allocate exactly the KV slots the plan counts
(`StepPlan.num_slots`: a VERIFY step's draft nodes and scratch included), then build the
step's device tensors in one host-to-device copy. The only place where a step's slots
are allocated; Scheduler.commit keeps or frees them.

Data flow: Scheduler.schedule() -> StepPlan -> prepare() -> StepBatch -> ModelRunner.run
(plain steps: ForwardBatch + SamplingBatch) or SpecRunner.run (VERIFY: the staged inputs
the draft and verification read). `extend_batch()` builds the extend layout over slots a
request already owns (no allocation): the draft's catch-up and draft-extend use it.
`Padding` (chosen by ModelRunner.padding) lays a DECODE or EXTEND batch out for a
captured CUDA-graph shape.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gearshift.attention.base import KVCache
from gearshift.faults import RequestFault
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.request import Request
from gearshift.runner.logprobs import logprob_plan, plan_logprobs
from gearshift.runner.penalties import penalty_batch, stage_penalties
from gearshift.runner.sampler import SamplingBatch
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import StepPlan
from gearshift.structured.mask import GrammarBatch
from gearshift.structured.matcher import step_masks

ALIGN_BYTES = 16  # staged parts start at multiples of this (Triton's pointer specialisation)


class Stager:
    """Collects host lists and moves them to the device in ONE copy: int64, int32 and float32
    parts side by side in one byte buffer, each a typed view of the device copy: each
    copy and each dtype conversion after it is a launch the host pays for while a VERIFY
    step's device waits."""

    _CODES = {torch.int64: "q", torch.int32: "i", torch.float32: "f"}

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pin = device.type == "cuda"
        self.parts: list[tuple[str, torch.dtype, list]] = []

    def add_ints(self, name: str, values: list[int]) -> None:
        self.parts.append((name, torch.int64, values))

    def add_int32(self, name: str, values: list[int]) -> None:
        self.parts.append((name, torch.int32, values))

    def add_floats(self, name: str, values: list[float]) -> None:
        self.parts.append((name, torch.float32, values))

    def add_tensor(self, name: str, values: torch.Tensor) -> None:
        """A host tensor's elements, flattened (its dtype kept)."""
        self.parts.append((name, values.dtype, values))

    def to_device(self) -> dict[str, torch.Tensor]:
        """One copy; every part starts 16-byte aligned. Triton specialises a kernel on
        whether each pointer is 16-byte aligned, so parts at offsets that depend on the
        lengths before them made kernels (rope, the sampler) compile again in the middle
        of a run whenever a batch's lengths flipped an alignment."""
        if not self.parts:
            return {}
        buf = bytearray()
        spans = []
        for name, dtype, vals in self.parts:
            # array.array converts a list in one C loop; torch.tensor(list) is ~10x slower
            if isinstance(vals, torch.Tensor):
                raw, n = vals.contiguous().numpy().tobytes(), vals.numel()
            else:
                raw, n = array(self._CODES[dtype], vals).tobytes(), len(vals)
            spans.append((name, dtype, len(buf), n))
            buf += raw
            buf += bytes(-len(buf) % ALIGN_BYTES)
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        if self.pin:
            t = t.pin_memory()
        t = t.to(self.device, non_blocking=True)
        return {name: t[off: off + n * dtype.itemsize].view(dtype)
                for name, dtype, off, n in spans}


@dataclass(frozen=True, slots=True)
class Padding:
    """The CUDA-graph shape a plain step is laid out for (ModelRunner.padding(plan) picks
    it; None = eager, unpadded). Padding uses the reserved dummy row 0 and dummy slot 0
    (kv_pool.py), so it never reads or writes a real request's KV.

    DECODE to `rows` (tokens == rows): every padding row is a 1-token dummy request.
    EXTEND to (`rows`, `tokens`): the real requests (T tokens), then ONE dummy request
    holding the tokens - T padding tokens, then empty requests up to `rows`:

        request      r0   r1   r2  | dummy       | empty  empty ...
        row          5    2    7   | 0           | 0      0
        prefix       4    9    0   | 0           | 0      0
        extend       3    1    2   | tokens - T  | 0      0
        start        0    3    4   | T           | tokens tokens
        logits idx   2    3    5   | 0           | 0      0
        tokens       real (T)      | id 0, slot 0, positions 0 .. tokens - T - 1

    The dummy's keys are req_to_token[0, :tokens - T] = slot 0, so the extend kernel
    reads row 0 only (runner buckets never exceed the table's columns); empty requests
    own no tile. The kernel's grid then depends on (tokens, rows) alone.
    """

    rows: int  # per-request rows: DECODE graph batch size; max_num_seqs + 1 for EXTEND
    tokens: int  # token rows (== rows for DECODE)


def pad_batch(mode: ForwardMode, rows: list[int], prefix: list[int], extend: list[int],
              input_ids: list[int], out_loc: list[int], padding: Padding | None):
    """Host lists of a batch with `padding`'s dummy requests and tokens appended (see
    Padding). -> (rows, prefix, extend, input_ids, out_loc); unchanged without padding."""
    if padding is None:
        return list(rows), list(prefix), list(extend), list(input_ids), list(out_loc)
    if mode is ForwardMode.DECODE:
        pad = max(padding.rows - len(rows), 0)
        return (rows + [0] * pad, prefix + [0] * pad, extend + [1] * pad,
                input_ids + [0] * pad, out_loc + [0] * pad)
    assert mode is ForwardMode.EXTEND, f"no padded layout for {mode.name}"
    n = padding.tokens - sum(extend)  # the dummy request's tokens
    empty = padding.rows - len(rows) - 1
    assert n >= 0 and empty >= 0, f"{len(rows)} requests / {sum(extend)} tokens exceed {padding}"
    return (rows + [0] * (1 + empty), prefix + [0] * (1 + empty), extend + [n] + [0] * empty,
            input_ids + [0] * n, out_loc + [0] * n)


def stage_forward(st: Stager, rows: Sequence[int], prefix: list[int], extend: list[int],
                  input_ids: list[int], out_loc: list[int], num_real: int | None = None,
                  logits_indices: list[int] | None = None) -> None:
    """Per-token and per-request lists of an extend-layout batch (padding already applied;
    requests from index `num_real` on are padding: their logits index is 0). Each
    request's logits row is its last token unless `logits_indices` says otherwise."""
    num_real = len(extend) if num_real is None else num_real
    positions: list[int] = []
    token_rows: list[int] = []
    start, logits_idx, acc = [], [], 0
    for i, (row, p, n) in enumerate(zip(rows, prefix, extend)):
        positions.extend(range(p, p + n))
        token_rows.extend([row] * n)
        start.append(acc)
        acc += n
        logits_idx.append(acc - 1 if i < num_real else 0)
    st.add_ints("input_ids", input_ids)
    st.add_ints("positions", positions)
    st.add_ints("out_cache_loc", out_loc)
    st.add_ints("token_rows", token_rows)
    st.add_int32("out_cache_loc32", out_loc)  # req_to_token's dtype
    st.add_ints("req_pool_indices", list(rows))
    st.add_int32("seq_lens", [p + n for p, n in zip(prefix, extend)])
    st.add_int32("extend_lens", extend)
    st.add_int32("extend_start_loc", start)
    st.add_int32("prefix_lens", prefix)
    st.add_ints("logits_indices", logits_idx if logits_indices is None else logits_indices)


def forward_batch(d: dict[str, torch.Tensor], mode: ForwardMode, bs: int, prefix: list[int],
                  extend: list[int], kv: KVCache | None) -> ForwardBatch:
    """ForwardBatch over staged tensors; with `kv`, records the tokens' slots in req_to_token."""
    if kv is not None:  # this step's tokens now live in these slots
        kv.req_to_token[d["token_rows"], d["positions"]] = d["out_cache_loc32"]
    seq = [p + n for p, n in zip(prefix, extend)]
    return ForwardBatch(
        mode=mode, batch_size=bs, padded_batch_size=len(extend),
        num_tokens=d["input_ids"].shape[0], input_ids=d["input_ids"], positions=d["positions"],
        out_cache_loc=d["out_cache_loc"], req_pool_indices=d["req_pool_indices"],
        seq_lens=d["seq_lens"], extend_lens=d["extend_lens"],
        extend_start_loc=d["extend_start_loc"], prefix_lens=d["prefix_lens"],
        logits_indices=d["logits_indices"],
        seq_lens_cpu=seq, extend_lens_cpu=extend, prefix_lens_cpu=prefix,
        max_seq_len=max(seq, default=0), max_extend_len=max(extend, default=0),
    )


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
    forward: ForwardBatch | None = None  # plain steps; a VERIFY step's comes from its drafts
    # VERIFY: roots [B] (pending tokens), prefix [B], rows [B], k [B], scratch [B * S] and
    # node_slots [B * N] (0-padded to the widest chain or tree; a chunk riding along is cut
    # to that width), in the same copy as `sampling`
    staged: dict[str, torch.Tensor] | None = None


class BatchBuilder:
    def __init__(self, slots: SlotPool, rows: ReqRowPool, kv: KVCache, device: torch.device) -> None:
        self.slots, self.rows, self.kv = slots, rows, kv
        self.device = device

    def prepare(self, plan: StepPlan, padding: Padding | None = None) -> StepBatch:
        """Slots and device tensors for `plan`; a plain step laid out for `padding` (the
        graph shape ModelRunner.padding(plan) picked; None: unpadded). Every request's node
        slots join its slot list (positions prefix.. for plain steps and chains), so a
        request released mid-step frees them too. Each request's own inputs are read
        before anything is allocated: a failure there raises RequestFault for it alone."""
        verify = plan.mode is ForwardMode.VERIFY
        tokens = []  # plain: the step's input ids per request; VERIFY: the pending token
        constrained = False  # some request samples under a grammar
        for req, n, prefix in zip(plan.reqs, plan.extend_lens, plan.prefix_lens):
            try:
                tokens.append(req.token_slice(prefix, prefix + (1 if verify else n)))
            except Exception as e:  # noqa: BLE001 - this request's fault, not the step's
                raise RequestFault(req, e) from e
            constrained = constrained or req.grammar is not None
        # the next token's masks (VERIFY: the pending position's, for the draft's first level)
        pad = (padding.rows - plan.batch_size) if padding is not None \
            and plan.mode is ForwardMode.DECODE else 0
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
            return self._verify(plan, slots, [t[0] for t in tokens], fresh, masks)
        return self._plain(plan, slots, padding, [t for ts in tokens for t in ts], fresh, masks)

    def _record_cached(self, cached: list[tuple[int, list[int]]]) -> None:
        """req_to_token rows of requests that start after a cached prefix: its slots."""
        st = Stager(self.device)
        st.add_ints("rows", [row for row, s in cached for _ in s])
        st.add_ints("pos", [p for _, s in cached for p in range(len(s))])
        st.add_int32("slots", [x for _, s in cached for x in s])
        d = st.to_device()
        self.kv.req_to_token[d["rows"], d["pos"]] = d["slots"]

    def _plain(self, plan: StepPlan, slots: list[list[int]], padding: Padding | None,
               input_ids: list[int], fresh: list[bool], masks: torch.Tensor | None) -> StepBatch:
        bs = plan.batch_size
        rows, prefix, extend, input_ids, out_loc = pad_batch(
            plan.mode, [r.req_pool_index for r in plan.reqs], plan.prefix_lens, plan.extend_lens,
            input_ids, [x for s in slots for x in s], padding)
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
        if padding is not None and plan.mode is ForwardMode.EXTEND:
            fb.max_extend_len = padding.tokens  # the grid bound: a constant of the graph shape
        assert fb.mode is ForwardMode.EXTEND or fb.num_tokens == fb.padded_batch_size, \
            "DECODE must carry one token per row"
        return StepBatch(slots, sampling_batch(d, plan.reqs, planned, masks), forward=fb)

    def _verify(self, plan: StepPlan, slots: list[list[int]], roots: list[int],
                fresh: list[bool], masks: torch.Tensor | None) -> StepBatch:
        """The inputs every stage of a VERIFY step reads, staged in one copy. The pending
        token (`roots`) is usually the last sampled one, or the last prompt token when a
        chunked prefill ended with a 1-token chunk."""
        reqs = plan.reqs
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
        return StepBatch(slots, sb, staged=d)

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
