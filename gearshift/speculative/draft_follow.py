"""DraftFollower: keeps the draft current over committed tokens, so that speculation
resumes at full acceptance after any number of plain (K = 0) steps. Its KV lives at the
target's slots; for EAGLE-3 so does what it needs of the target: fc(target features) per
token, stored by slot.

    plain step (K = 0):  store: EAGLE-3 keeps fc(features) of the step's tokens at their
                         slots (one small GEMM + scatter, far cheaper than a draft forward
                         per plain step); the draft falls behind on decoders, but extends
                         over a prompt chunk (all but its last row) behind the target's pass,
                         or, while the next step prefills too (a burst of arrivals, a long
                         prompt), behind the last such step's pass: no chunk's first token
                         waits for the draft's pass over the chunks before it
    VERIFY step:         catch_up first, as planned (plan.draft_catch_up: the rows each
                         request about to speculate is behind on, priced by the policy when
                         it chose K): the draft extends over that backlog (graphed, K + 1
                         wide, when it fits, else eager chunks; short backlogs graphed apart
                         from long ones),
                         then after verification the draft extends over the accepted tokens
                         (+ bonus) of the requests it is current for (padded to K + 1: a graph)

`Request.draft_rows` counts the draft rows computed (row t consumes token t + 1 and the
feature of position t for EAGLE-3, token t for a draft model). Stateless proposers (n-gram)
skip all of it.

Data flow: Engine (plan.draft_follows) -> SpecRunner.after_plain (plain steps) / run and
after_commit (VERIFY steps) -> DraftFollower -> proposer.store_features / draft_extend.
"""

from __future__ import annotations

import time

import torch

from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.request import Request, RequestStatus
from gearshift.runner.batch import BatchBuilder
from gearshift.runner.model_runner import ModelRunner, device_ms, graph_inputs, rebuild_batch
from gearshift.runner.staging import Stager, forward_batch, stage_forward, to_device
from gearshift.scheduler.plan import StepPlan
from gearshift.speculative.follow_up import accepted, extend_batch
from gearshift.speculative.proposers.base import Proposer


class DraftFollower:
    def __init__(self, proposer: Proposer, runner: ModelRunner, builder: BatchBuilder,
                 num_draft_tokens: int, feed=None, every_token: bool = False) -> None:
        self.proposer, self.runner, self.builder = proposer, runner, builder
        self.num_draft_tokens = num_draft_tokens
        # keep the features of every committed token, opted-out requests' too (the prefix
        # cache: a hit's draft catches up from them), not only of those the draft lags on
        self.every_token = every_token
        self.feed = feed  # Engine's TokenFeed: resolves placeholders of overlapped steps
        self._timing: tuple[float, tuple | None] | None = None  # latest catch_up: host ms, events
        self.deferred: list[Request] = []  # chunks whose draft pass waits for the prefill's end
        self.catch_up_rows = 0  # rows the latest catch_up ran the draft over

    def after_plain(self, plan: StepPlan, aux: torch.Tensor | None) -> None:
        """After an EXTEND / DECODE step: keep what the draft will need for these tokens."""
        reqs, prefix, extend, token_idx = [], [], [], []
        start = 0
        for req, p, n in zip(plan.reqs, plan.prefix_lens, plan.extend_lens):
            # opted out: never drafted for (unless the cache may serve its tokens to others)
            if not req.is_finished and (req.params.speculative or self.every_token):
                reqs.append(req)
                prefix.append(p)
                extend.append(n)
                token_idx.extend(range(start, start + n))
            start += n
        self.store(reqs, prefix, extend, aux, token_idx)
        chunks = [r for r, dec in zip(plan.reqs, plan.decoding) if not dec]
        if plan.prefill_continues:  # not between two chunks on the device: after the last
            self.deferred += chunks
            return
        chunks = list({id(r): r for r in self.deferred + chunks
                       if r.status is RequestStatus.RUNNING and not r.closing}.values())
        self.deferred = []
        self.extend_prompts(chunks, [r.num_computed_tokens - 1 for r in chunks])

    def extend_prompts(self, reqs: list[Request], ends: list[int]) -> None:
        """The draft over each prompt chunk just computed (its features stored), up to row
        ends[i]: all but the chunk's last row, whose token the step samples. Eager work,
        launched where it runs behind the step's target pass rather than on the next VERIFY
        step's critical path; the next catch-up takes the last row with the decoders' rows
        (graphed). Backlogs no longer than a draft-extend graph are left to it."""
        width = self.num_draft_tokens + 1
        todo = [(r, e) for r, e in zip(reqs, ends)
                if r.params.speculative and e - r.draft_rows > width]
        if todo and self.proposer.keeps_state:
            self._extend_backlog([r for r, _ in todo], [e for _, e in todo])

    def store(self, reqs: list[Request], prefix: list[int], extend: list[int],
              aux: torch.Tensor | None, token_idx: list[int]) -> None:
        """Keep the features of tokens prefix..prefix+n-1 (aux rows token_idx) at their
        slots, for a later catch_up; the draft's rows stay where they are."""
        self.store_slots([s for req, p, n in zip(reqs, prefix, extend) for s in req.slots[p:p + n]],
                         aux, token_idx)

    def store_slots(self, slots: list[int], aux: torch.Tensor | None,
                    token_idx: list[int]) -> None:
        """Keep the features at aux rows token_idx at KV slots `slots` (one each)."""
        if not slots or aux is None or not self.proposer.needs_features:
            return
        self.proposer.store_features(_device_index(slots, aux),
                                     aux.index_select(0, _device_index(token_idx, aux)))

    def catch_up(self, plan: StepPlan, max_tokens: int = 4096) -> None:
        """The draft's catch-up the plan states (plan.draft_catch_up: rows each request's
        draft is behind on, before it speculates): rounds of at most `max_tokens` tokens in
        all. Timed (`catch_up_ms`): it is the price of the plain steps before, not of this
        step's K (the policy priced it when it chose K)."""
        self._timing, self.catch_up_rows = None, 0
        self.deferred = []  # each request's backlog is caught up before it speculates
        if not any(plan.draft_catch_up):
            return
        reqs = [r for r, n in zip(plan.reqs, plan.draft_catch_up) if n]
        ends = [p for p, n in zip(plan.prefix_lens, plan.draft_catch_up) if n]
        t0 = time.perf_counter()
        events = None
        if self.runner.device.type == "cuda":
            events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            events[0].record()
        self.catch_up_rows = self._extend_backlog(reqs, ends, max_tokens)
        if events is not None:
            events[1].record()
        self._timing = ((time.perf_counter() - t0) * 1e3, events)

    def _extend_backlog(self, reqs: list[Request], ends: list[int], max_tokens: int = 4096
                        ) -> int:
        """The draft over the stored rows it is behind on, up to row ends[i] of each
        request, in rounds of at most `max_tokens` tokens. -> rows run."""
        store, rows = self.proposer.stored_features(), 0
        end = {id(r): e for r, e in zip(reqs, ends)}
        while True:
            behind = [r for r in reqs if r.draft_rows < end[id(r)]]
            if not behind:
                return rows
            for group in self._backlog_groups(behind, end):
                cap = max(1, max_tokens // len(group))
                prefix = [r.draft_rows for r in group]
                extend = [min(end[id(r)] - r.draft_rows, cap) for r in group]
                slots = [s for r, p, n in zip(group, prefix, extend) for s in r.slots[p:p + n]]
                self.extend(group, prefix, extend, store, slots)  # store rows are slot ids
                rows += len(slots)

    def _backlog_groups(self, behind: list[Request], end: dict[int, int]
                        ) -> list[list[Request]]:
        """The requests a few rows behind (the decoders of a plain step: a draft-extend
        graph) apart from long backlogs (a new request's prompt: eager), so that one
        arrival does not send the whole batch's catch-up down the eager path."""
        if not (self.proposer.graph_extend and self.runner.shape_graphs is not None):
            return [behind]
        width = self.num_draft_tokens + 1
        short = [r for r in behind if end[id(r)] - r.draft_rows <= width
                 and r.draft_rows + width <= self.runner.max_positions]
        if not short or len(short) == len(behind):
            return [behind]
        taken = {id(r) for r in short}
        return [short, [r for r in behind if id(r) not in taken]]

    def catch_up_ms(self) -> float:
        """What the latest catch_up added to its step: the longer of its host time and its
        device time (0 if nothing was behind). Read after the step's sync."""
        if self._timing is None:
            return 0.0
        host, events = self._timing
        return max(host, device_ms(events) or 0.0)

    def extend(self, reqs: list[Request], prefix: list[int], extend: list[int],
               aux: torch.Tensor | None, token_idx: list[int]) -> None:
        """The draft over rows prefix..prefix+n-1 of each request (aux rows token_idx are
        their features: target features, or stored fc(features) rows when aux is the store)."""
        if not reqs or not self.proposer.keeps_state:
            return
        shift = 1 if self.proposer.shifted_inputs else 0
        width = self._graph_width(prefix, extend)
        if width is None:
            ids = [t for req, p, n in zip(reqs, prefix, extend)
                   for t in req.token_slice(p + shift, p + n + shift)]
            fb = self.builder.extend_batch(ForwardMode.DRAFT_EXTEND, reqs, prefix, extend, ids)
            self._resolve(fb, ids)
            feats = None if aux is None else aux.index_select(0, _device_index(token_idx, aux))
            self.proposer.draft_extend(fb, feats)
        else:
            fb, ids, feat_idx = self._padded_extend(reqs, prefix, extend, token_idx, width,
                                                    shift)
            self._resolve(fb, ids)
            self._replay_extend(fb, width, aux, feat_idx)
        for req, p, n in zip(reqs, prefix, extend):
            req.draft_rows = p + n

    def follows_early(self, plan: StepPlan, width: int) -> bool:
        """Whether a VERIFY step of `plan` can launch the follow-up over its accepted tokens
        before the host reads them (follow_up.py): a stateful draft extending on graphs
        and `width` rows past every prefix inside the RoPE table."""
        return (self.proposer.keeps_state
                and self._graph_width(plan.prefix_lens, [1], width) is not None)

    def follow_accepted(self, plan: StepPlan, extend: list[int], store: list[int],
                        packed: torch.Tensor, staged: dict[str, torch.Tensor],
                        offsets: list[int], aux: torch.Tensor | None, width: int) -> None:
        """The draft extends over the accepted tokens of batch rows `extend` (padded to
        `width` each: a graph the warm-up captured) and the kept tokens' features of rows
        `store` are stored, laid out on the device from `packed` (follow_up.py). The
        caller sets draft_rows once it has read the accepted counts."""
        b = len(plan.reqs)
        node_slots = staged["node_slots"].view(b, -1)
        offs = _device_index(offsets, packed)
        shift = 1 if self.proposer.shifted_inputs else 0
        index = _device_index(extend, packed) if extend else None
        acc = accepted(packed, index, staged["roots"], node_slots, offs, width, shift) \
            if extend else None
        if store and aux is not None and self.proposer.needs_features:
            kept = acc if store == extend else accepted(
                packed, _device_index(store, packed), staged["roots"], node_slots, offs,
                width, shift)  # usually the same rows: every request of the step
            self.proposer.store_features(kept.slots.flatten(),
                                         aux.index_select(0, kept.feats.flatten()))
        if not extend:
            return
        fb = extend_batch(acc, staged["rows"].index_select(0, index),
                          staged["prefix"].index_select(0, index),
                          [plan.prefix_lens[i] for i in extend], self.runner.decode_pad(len(extend)))
        # dummy rows read feature row 0
        rows = torch.cat([acc.feats.flatten(),
                          acc.feats.new_zeros((fb.batch_size - len(extend)) * width)])
        self._replay_extend(fb, width, aux, rows)

    def _replay_extend(self, fb: ForwardBatch, width: int, aux: torch.Tensor | None,
                       feat_rows: torch.Tensor) -> None:
        """A padded draft-extend batch on its graph (`width` tokens a row), fed the features
        at aux rows `feat_rows` (EAGLE-3; none for a draft model)."""
        inputs = graph_inputs(fb)
        if aux is not None:
            inputs["feats"] = aux.index_select(0, feat_rows)
        self.runner.shape_graphs.run(
            ("draft_extend", fb.batch_size, width, None if aux is None else aux.shape[-1]),
            lambda s: self.proposer.draft_extend(rebuild_batch(fb, s), s.get("feats")), inputs)

    def _graph_width(self, prefix: list[int], extend: list[int], width: int | None = None
                     ) -> int | None:
        """Tokens per request of a graphed draft-extend: always K+1 (accepted drafts +
        bonus after a VERIFY step, or a catch-up's backlog, padded); None: run eagerly
        (more rows, prefill chunks, no graphs, or padding would run past the RoPE table).
        One width, not 1 and K+1: a VERIFY step where every request rejected its first
        draft extends 1 token each, a shape the warm-up may not have met at that batch
        size (a graph captured mid-run); the padding costs the one-layer draft a few more
        tokens."""
        if not (self.proposer.graph_extend and self.runner.shape_graphs is not None):
            return None
        width = width or self.num_draft_tokens + 1
        if max(extend) > width or max(prefix) + width > self.runner.max_positions:
            return None
        return width

    def _padded_extend(self, reqs, prefix, extend, token_idx, width: int, shift: int):
        """Every request padded to `width` tokens (input 0, KV slot 0: only padding queries,
        which come after the real ones, see them), the batch padded to a graph size with
        dummy requests on row 0; each request's logits row is its last REAL token.
        -> (batch, input ids, device rows of the features to feed)."""
        rows_pad = self.runner.decode_pad(len(reqs))
        ids, out_loc, idx, last = [], [], [], []
        it = iter(token_idx)
        for i, (req, p, n) in enumerate(zip(reqs, prefix, extend)):
            fill = width - n
            ids += req.token_slice(p + shift, p + n + shift) + [0] * fill
            out_loc += req.slots[p:p + n] + [0] * fill
            idx += [next(it) for _ in range(n)] + [0] * fill
            last.append(i * width + n - 1)
        dummy = rows_pad - len(reqs)
        ids, out_loc, idx = ids + [0] * dummy * width, out_loc + [0] * dummy * width, \
            idx + [0] * dummy * width
        last += [len(reqs) * width + j * width for j in range(dummy)]
        st = Stager(self.runner.device)
        rows = [r.req_pool_index for r in reqs] + [0] * dummy
        prefix, ext = list(prefix) + [0] * dummy, [width] * rows_pad
        stage_forward(st, rows, prefix, ext, ids, out_loc, logits_indices=last)
        st.add_ints("feat_idx", idx)  # the features' rows, in the same copy
        d = st.to_device()
        fb = forward_batch(d, ForwardMode.DRAFT_EXTEND, rows_pad, prefix, ext, None)
        return fb, ids, d["feat_idx"]

    def _resolve(self, fb: ForwardBatch, ids: list[int]) -> None:
        if self.feed is not None and min(ids) < 0:  # tokens still on the device (overlap)
            fb.input_ids = self.feed.resolve_ids(fb.input_ids)


def _device_index(idx: list[int], like: torch.Tensor) -> torch.Tensor:
    return to_device(idx, torch.long, like.device)
