"""SpecWorker: one VERIFY step (draft -> verify -> commit -> draft-extend); the draft-extend
itself (also after plain EXTEND / DECODE steps) is DraftFollower's (speculative/draft_follow.py).

    plan (K per request, from the policy; slots already counted by the scheduler)
      -> prepare: allocate node slots + draft scratch per request      (host)
      -> proposer.propose -> DraftTree [B, N]                          (device)
      -> target VERIFY over the valid nodes, tree attention            (device)
      -> verify: accepted path + bonus per request                     (device)
      -> one host sync -> Scheduler.commit_spec (keep the path's slots, free the rest)
      -> req_to_token[row, L..L+a] = path slots -> proposer.draft_extend(accepted rows)

Data flow: Engine.step -> SpecWorker.verify_step (VERIFY plans) / draft_extend_after.
"""

from __future__ import annotations

from collections import Counter
from itertools import accumulate

import torch

from gearshift.config import EngineConfig
from gearshift.forward_batch import ForwardBatch, ForwardMode, TreeAttention
from gearshift.request import Request
from gearshift.runner.batch import (
    BatchBuilder,
    Stager,
    forward_batch,
    sampling_batch,
    stage_forward,
    stage_sampling,
)
from gearshift.runner.model_runner import ModelRunner
from gearshift.scheduler.kv_pool import SlotPool
from gearshift.scheduler.plan import StepPlan
from gearshift.scheduler.scheduler import Scheduler, StepOutput
from gearshift.speculative.draft_follow import DraftFollower
from gearshift.speculative.proposers.base import ProposeContext, Proposer
from gearshift.speculative.tree import ancestor_mask
from gearshift.speculative.verify import verify
from gearshift.speculative.verify_device import (
    greedy_packed,
    node_valid,
    pack,
    pad_greedy_inputs,
    record_paths,
)


def create_proposer(config: EngineConfig, runner: ModelRunner) -> Proposer:
    algo = config.speculative_algorithm
    if algo == "ngram":
        from gearshift.speculative.proposers.ngram import NgramProposer

        return NgramProposer(config.ngram_min, config.ngram_max)
    if algo == "draft":
        from gearshift.speculative.proposers.draft_model import DraftModelProposer

        return DraftModelProposer(config, runner.model.config, runner.kv, runner.max_positions)
    from gearshift.models.default import default_head_dir
    from gearshift.speculative.proposers.eagle3 import Eagle3Proposer

    head = config.draft_model or str(default_head_dir())
    return Eagle3Proposer(config, head, runner.model.config, runner.model, runner.kv,
                          runner.max_positions, config.max_num_seqs)


class SpecWorker:
    def __init__(self, config: EngineConfig, runner: ModelRunner, slots: SlotPool,
                 builder: BatchBuilder) -> None:
        self.runner, self.slots, self.builder = runner, slots, builder
        self.proposer = create_proposer(config, runner)
        self.proposer.runner = runner  # its draft steps replay CUDA graphs when the runner has them
        self.topk = config.draft_topk  # the widest tree a step may verify (1: chains only)
        self.max_k = config.num_draft_tokens
        self.tree_nodes = config.verify_nodes if self.topk > 1 else 0
        self.capture = self.proposer.aux_layers if self.proposer.needs_features else ()
        self.draft_frac = self.proposer.cost_fraction(runner.model)  # a draft step / target step
        self.split_k_verify_below = 64  # (requests x kv heads) under which chains use split-K
        # steps_by_k.*, chain_steps, tree_steps, proposed, accepted, tree_accepted,
        # tree_top1_accepted, accept_len.*
        self.stats = Counter()
        # acceptance evidence over all requests (EMA): [chains, trees, the top-1 chains of
        # those trees (same steps)]
        self._pop = [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
        self.follow = DraftFollower(self.proposer, runner, builder, self.max_k)
        self.measured_costs: dict | None = None  # {K: [[bs, ms]]} from the start-up warm-up

    # ------------------------------------------------------------------ sizing
    # A step verifies chains (topk 1: K + 1 nodes) or, when the engine has a tree width
    # (draft_topk > 1), one draft tree per request (`verify_nodes` nodes): the plan says which.
    def nodes(self, k: int, topk: int = 1) -> int:
        if k == 0:
            return 1
        return 1 + k if topk == 1 else self.tree_nodes

    def scratch(self, k: int, topk: int = 1) -> int:
        if k == 0:
            return 0
        return self.proposer.scratch_slots(k if topk == 1 else self.max_k, topk)

    def slots_needed(self, k: int, topk: int = 1) -> int:
        """KV slots a request needs for a step with draft length k (1 = plain decode) and
        tree width topk."""
        return self.nodes(k, topk) + self.scratch(k, topk)

    def gear(self, plan: StepPlan) -> int:
        """The cost model's key of a planned step: K for chains (0 = plain decode), max K
        + 1 for a tree step (policy/goodput.py)."""
        if not plan.speculating:
            return 0
        return self.max_k + 1 if plan.draft_topk > 1 else max(plan.draft_lens)

    def counters(self) -> tuple:
        """Everything a run counts here (stats, the population's acceptance evidence), for
        restore_counters: the start-up warm-up is not part of any run."""
        return self.stats.copy(), [list(p) for p in self._pop]

    def restore_counters(self, saved: tuple) -> None:
        self.stats.clear()
        self.stats.update(saved[0])
        self._pop = [list(p) for p in saved[1]]

    def population(self) -> tuple[float, float]:
        """Acceptance evidence over the last ~100 request-steps of every request: (accepted
        drafts, accepted + rejections). The policy's prior for a request with little
        evidence of its own (new, or long at K = 0)."""
        return self._pop[0][0], self._pop[0][1]

    def tree_population(self) -> tuple[float, float, float, float] | None:
        """The same evidence from tree steps, then what their top-1 chains accepted on the
        same steps (None: the engine verifies chains only)."""
        return (*self._pop[1], *self._pop[2]) if self.topk > 1 else None

    # ------------------------------------------------------------------ plain steps
    def draft_extend_after(self, plan: StepPlan, aux: torch.Tensor | None) -> None:
        """After an EXTEND / DECODE step: the draft covers the tokens it just computed, and
        the acceptance evidence of requests that decoded plainly ages (see `_account`)."""
        self.follow.after_plain(plan, aux)
        for req, n, smp in zip(plan.reqs, plan.extend_lens, plan.sample):
            if n == 1 and smp:
                _age(req)

    def split_k_chains(self, b: int) -> bool:
        """Do a step's b chains verify with split-K tree attention (graphed only)? Few
        (request, kv head) pairs cannot fill the GPU: split-K spreads each prefix over the
        SMs; beyond that, causal extend reads each prefix once. Decided on the PADDED batch,
        the graph's shape: the warm-up runs every graph size exactly, and a 6-request step
        padded to 8 must replay what it captured at 8 (deciding on 6 captured a new graph
        mid-run: H200, session 7)."""
        if self.runner.shape_graphs is None:
            return False
        rows = self.runner.decode_pad(b)
        return rows * self.runner.model.config.num_kv_heads < self.split_k_verify_below

    # ------------------------------------------------------------------ VERIFY steps
    @torch.inference_mode()
    def verify_step(self, plan: StepPlan, scheduler: Scheduler) -> list[StepOutput]:
        """Decoding requests verify 1 + K tokens; prefill chunks in the same plan ("riders",
        chains only) extend as usual in the same causal pass and sample at their end.
        If the step fails before its commit, the slots it allocated go back to the pool."""
        allocated: list[list[int]] = []
        try:
            return self._verify_step(plan, scheduler, allocated)
        except BaseException:
            if allocated and allocated[-1] is not None:  # not committed yet
                for slots in allocated:
                    self.slots.free(slots)
            raise

    def _verify_step(self, plan: StepPlan, scheduler: Scheduler,
                     allocated: list[list[int]]) -> list[StepOutput]:
        reqs, ks, topk = plan.reqs, plan.draft_lens, plan.draft_topk
        b = len(reqs)
        ride = [not (n == 1 and smp) for n, smp in zip(plan.extend_lens, plan.sample)]
        node_slots, scratch = [], []
        for req in reqs:  # riders admitted this step get their req_to_token row here
            if req.req_pool_index < 0:
                req.req_pool_index = self.builder.rows.alloc()
        for k, n, r in zip(ks, plan.extend_lens, ride):
            node_slots.append(self.slots.alloc(n if r else self.nodes(k, topk)))
            allocated.append(node_slots[-1])
            scratch.append(self.slots.alloc(self.scratch(k, topk)))
            allocated.append(scratch[-1])
        depth = max(ks)
        n_max = max(len(s) for s in node_slots) if topk == 1 else self.tree_nodes
        s_max = max(self.scratch(k, topk) for k in ks)
        st = Stager(self.runner.device)
        # the pending token: usually the last sampled one, or the last prompt token when a
        # chunked prefill ends with a 1-token chunk
        st.add_ints("roots", [r.token_slice(r.num_computed_tokens, r.num_computed_tokens + 1)[0]
                              for r in reqs])
        st.add_ints("prefix", [r.num_computed_tokens for r in reqs])
        st.add_ints("rows", [r.req_pool_index for r in reqs])
        st.add_ints("k", list(ks))
        st.add_ints("scratch", [x for s in scratch for x in s + [0] * (s_max - len(s))])
        st.add_ints("node_slots", [x for s in node_slots for x in s + [0] * (n_max - len(s))])
        stage_sampling(st, reqs, 0)
        d = st.to_device()
        sb = sampling_batch(d, reqs)
        prefix_cpu = [r.num_computed_tokens for r in reqs]
        # the draft catches up on rows committed while these requests ran at K = 0
        self.follow.catch_up([r for r, k, rd in zip(reqs, ks, ride) if k and not rd])
        ctx = ProposeContext(reqs, ks, depth, topk, n_max, d["roots"], d["prefix"],
                             prefix_cpu, d["rows"], d["scratch"].view(b, s_max), sb)
        tree, nodes_override = self.proposer.propose(ctx)
        n_tree = tree.num_nodes  # a tree is smaller than its budget when K was capped
        n_nodes = nodes_override or [min(len(s), n_tree) if k else 1
                                     for s, k in zip(node_slots, ks)]
        # tokens each request sends through the target (a rider: its whole chunk)
        n_tokens = [len(s) if r else n for s, r, n in zip(node_slots, ride, n_nodes)]
        offsets = [0, *accumulate(n_tokens)][:b]  # first target token of each request
        if topk == 1 and (any(ride) or not self.split_k_chains(b)):
            # chains verify as a causal extend over positions L..L+K (prefix read once)
            fb, flat, key, node_tok = self._chain_verify_batch(reqs, tree, node_slots, n_nodes,
                                                               n_tree, ride)
        else:
            flat_cpu = [i * n_tree + j for i, n in enumerate(n_nodes) for j in range(n)]
            pad = 0
            if self.runner.shape_graphs is not None:  # pad to a graph shape: dummy row 0, slot 0
                pad = self.runner.decode_pad(b) * n_tree - len(flat_cpu)
            st2 = Stager(self.runner.device)
            st2.add_ints("flat", flat_cpu)
            st2.add_ints("rows", [r.req_pool_index for r, n in zip(reqs, n_nodes)
                                  for _ in range(n)] + [0] * pad)
            node_prefix = [p for p, n in zip(prefix_cpu, n_nodes) for _ in range(n)] + [0] * pad
            st2.add_ints("prefix", node_prefix)
            # the batch's int32 fields and index ranges, staged (no conversion launches)
            t_all = len(node_prefix)
            st2.add_int32("prefix32", node_prefix)
            st2.add_int32("seq32", [p + 1 for p in node_prefix])
            st2.add_int32("ones32", [1] * t_all)
            st2.add_int32("ar32", list(range(t_all)))
            st2.add_ints("ar", list(range(t_all)))
            d2 = st2.to_device()
            flat = d2["flat"]
            slots_bn = d["node_slots"].view(b, n_max)[:, :n_tree] if n_max >= n_tree else \
                torch.nn.functional.pad(d["node_slots"].view(b, n_max), (0, n_tree - n_max))
            fb = self._tree_verify_batch(tree, slots_bn, d2, depth, max(prefix_cpu), pad)
            key = ("verify-tree", fb.num_tokens, n_tree) if self.runner.shape_graphs is not None \
                and fb.num_tokens <= self.runner.max_verify_graph_tokens else None
            node_tok = None
        logits_t, aux = self.runner.forward_all(fb, self.capture, graph_key=key)  # [T(+pad), V]
        # the tree path's accepted slots go to req_to_token on the device (a chain verified
        # as an extend recorded its nodes' slots while building the batch)
        record = None if node_tok is not None else (d["rows"], d["prefix"], slots_bn)
        if sb.all_greedy:
            packed = self._verify_greedy(tree, logits_t, flat, node_tok, d["k"], depth, record,
                                         graphed=key is not None, per_row=_uniform(n_nodes))
        else:
            logits_t = logits_t[node_tok] if node_tok is not None else logits_t[: flat.shape[0]]
            logits = torch.zeros(b * n_tree, logits_t.shape[-1], device=logits_t.device)
            logits[flat] = logits_t
            valid = node_valid(flat, d["k"], tree.depths)
            res = verify(tree, valid, logits.view(b, n_tree, -1), sb, depth, topk)
            if record is not None:
                record_paths(self.runner.kv.req_to_token, *record, res)
            packed = pack(res)
        scheduler.prepare_next(plan)  # host work for the next plan while the device runs
        packed = packed.tolist()  # the step's one host sync
        if self.follow.catch_up_rows:  # what leaving K = 0 cost (its events are done now)
            self.stats["catch_up_rows"] += self.follow.catch_up_rows
            self.stats["catch_up_ms"] += self.follow.catch_up_ms()
        new_tokens, kept, freed, rows_used = [], [], [], []
        for i in range(b):
            if ride[i]:  # the whole chunk stays; its last token's sample only if it ends the prompt
                a, path = 0, list(range(len(node_slots[i])))
                new_tokens.append(packed[i][depth + 2:][:1] if plan.sample[i] else [])
            else:
                a = packed[i][0]
                path = packed[i][1:depth + 2][:a + 1]
                new_tokens.append(packed[i][depth + 2:][:a + 1])
                if ks[i]:  # the request's own counters before commit: its outputs carry them
                    reqs[i].spec_proposed += n_nodes[i] - 1
                    reqs[i].spec_accepted += a
            kept.append([node_slots[i][j] for j in path])
            keep = set(path)
            freed.append([s for j, s in enumerate(node_slots[i]) if j not in keep] + scratch[i])
            rows_used.append(path)
        allocated.append(None)  # from here on the scheduler owns (or has freed) every slot
        outputs = scheduler.commit_spec(plan, new_tokens, kept, freed)
        live = [i for i, r in enumerate(reqs) if not r.is_finished and r.params.speculative]
        # the draft follows where it is current, else stores; both groups are split before
        # either runs (extend moves draft_rows: split after it, every extended request
        # would also be stored, ~0.2 ms of host time per VERIFY step on the H200)
        current = [reqs[i].draft_rows == prefix_cpu[i] for i in live]
        for follows in (True, False):
            group = [i for i, cur in zip(live, current) if cur is follows]
            args = ([reqs[i] for i in group], [prefix_cpu[i] for i in group],
                    [len(rows_used[i]) for i in group], aux,
                    [offsets[i] + j for i in group for j in rows_used[i]])
            (self.follow.extend if follows else self.follow.store)(*args)
        # the acceptance statistics once the draft's forward is launched: the device runs it
        # meanwhile (before, ~0.4 ms of this loop at batch 32 left the H200 idle)
        for i in range(b):
            if not ride[i]:
                self._account(reqs[i], ks[i], topk, n_nodes[i] - 1, packed[i][0],
                              packed[i][2 * depth + 3])
        return outputs

    def _chain_verify_batch(self, reqs, tree, node_slots, n_nodes, n_tree, ride):
        """Node j of a chain sits at position L + j: record its slot in req_to_token and
        verify with ordinary causal extend attention (the prefix is read once per request).
        Riders contribute their prompt chunk; their node 0 is the chunk's last token.
        -> (batch, flat node indices, graph key, target token of each flat node)."""
        st = Stager(self.runner.device)
        flat, node_tok, rider_pos, rider_ids, t = [], [], [], [], 0
        extend = [len(s) if r else n for s, r, n in zip(node_slots, ride, n_nodes)]
        for i, (req, n, r) in enumerate(zip(reqs, extend, ride)):
            if r:
                flat.append(i * n_tree)
                node_tok.append(t + n - 1)
                rider_pos.extend(range(t, t + n))
                rider_ids.extend(req.token_slice(req.num_computed_tokens,
                                                 req.num_computed_tokens + n))
            else:
                flat.extend(i * n_tree + j for j in range(n))
                node_tok.extend(range(t, t + n))
            t += n
        prefix = [r.num_computed_tokens for r in reqs]
        out_loc = [s for slots, n in zip(node_slots, extend) for s in slots[:n]]
        rows = [r.req_pool_index for r in reqs]
        key = None
        if (self.runner.shape_graphs is not None and len(set(extend)) == 1 and not any(ride)
                and self.runner.decode_pad(len(reqs)) * extend[0]
                <= self.runner.max_verify_graph_tokens):
            # uniform candidates per request: pad to a graph batch size (dummy row 0, slot 0)
            n, pad = extend[0], self.runner.decode_pad(len(reqs)) - len(reqs)
            rows, prefix, extend = rows + [0] * pad, prefix + [0] * pad, extend + [n] * pad
            out_loc = out_loc + [0] * (n * pad)
            key = ("verify", len(rows), n)
        stage_forward(st, rows, prefix, extend, [0] * len(out_loc), out_loc)
        st.add_ints("flat", flat)
        st.add_ints("node_tok", node_tok)
        st.add_ints("rider_pos", rider_pos)
        st.add_ints("rider_ids", rider_ids)
        d = st.to_device()
        ids = torch.zeros(len(out_loc), dtype=torch.long, device=d["flat"].device)
        ids[d["node_tok"]] = tree.tokens.view(-1)[d["flat"]]  # riders: their chunk's last token
        ids[d["rider_pos"]] = d["rider_ids"]  # ... is overwritten by the prompt token itself
        d["input_ids"] = ids
        fb = forward_batch(d, ForwardMode.VERIFY, len(reqs), prefix, extend, self.runner.kv)
        fb.logits_indices = torch.arange(fb.num_tokens, device=fb.input_ids.device)
        return fb, d["flat"], key, d["node_tok"]

    def _tree_verify_batch(self, tree, slots_bn, d2, depth: int, max_prefix: int,
                           pad: int) -> ForwardBatch:
        """`pad` dummy tokens (row 0, slot 0, seeing only slot 0) follow the real ones."""
        b, n = tree.tokens.shape
        flat = d2["flat"]
        anc = tree.ancestors if tree.ancestors is not None else ancestor_mask(tree.parents, depth)
        extra = torch.where(anc, slots_bn[:, None, :], -1).view(b * n, n)[flat]  # [T, N]
        # nodes deeper than their request's K are never accepted; keep their rows in range
        positions = (d2["prefix"][: flat.shape[0]] + tree.depths.view(-1)[flat]).clamp_max(
            self.runner.max_positions - 1)
        ids, out_loc = tree.tokens.view(-1)[flat], slots_bn.reshape(-1)[flat]
        if pad:
            pad_extra = torch.full((pad, n), -1, dtype=extra.dtype, device=extra.device)
            pad_extra[:, 0] = 0
            extra = torch.cat([extra, pad_extra])
            zeros = ids.new_zeros(pad)
            ids, positions, out_loc = (torch.cat([x, zeros]) for x in (ids, positions, out_loc))
        t = ids.shape[0]
        prefix32 = d2["prefix32"]
        return ForwardBatch(
            mode=ForwardMode.VERIFY, batch_size=t, padded_batch_size=t, num_tokens=t,
            input_ids=ids, positions=positions, out_cache_loc=out_loc,
            req_pool_indices=d2["rows"],
            seq_lens=d2["seq32"], extend_lens=d2["ones32"], extend_start_loc=d2["ar32"],
            prefix_lens=prefix32, logits_indices=d2["ar"], seq_lens_cpu=[], extend_lens_cpu=[],
            prefix_lens_cpu=[], max_seq_len=max_prefix + 1, max_extend_len=1,
            tree=TreeAttention(d2["rows"], prefix32, extra, max_prefix),
        )

    def _verify_greedy(self, tree, logits_t, flat, node_tok, k, depth: int, record,
                       graphed: bool, per_row: int) -> torch.Tensor:
        """Greedy verification from the target's argmax (no [B, N, V] logits gathered) ->
        packed [B, 2 * depth + 3]; one CUDA graph per shape after a graphed target forward,
        its batch padded like the target's (a decode graph size), so that requests
        finishing mid-run meet graphs captured at start-up instead of capturing new ones."""
        b, n = tree.tokens.shape
        inputs = {"target": logits_t.argmax(-1), "flat": flat, "k": k, "tokens": tree.tokens,
                  "parents": tree.parents, "depths": tree.depths}  # target: [T(+pad)]
        if node_tok is not None:
            inputs["node_tok"] = node_tok
        if record is not None:
            inputs.update(zip(("rows", "prefix", "slots"), record))
        req_to_token = self.runner.kv.req_to_token
        graphs = self.runner.shape_graphs
        if not graphed or graphs is None:
            return greedy_packed(inputs, b, n, depth, req_to_token if record is not None else None)
        pb = self.runner.decode_pad(b)
        if pb > b:
            pad_greedy_inputs(inputs, b, pb, n, per_row)

        def fn(s):
            return greedy_packed(s, pb, n, depth, req_to_token if record is not None else None)

        key = ("verify-greedy", pb, n, depth, inputs["target"].shape[0], inputs["flat"].shape[0],
               node_tok is not None, record is not None)
        return graphs.run(key, fn, inputs)[:b]

    def _account(self, req: Request, k: int, topk: int, proposed: int, accepted: int,
                 chain: int = -1) -> None:
        """Engine counters and acceptance evidence of one request's VERIFY outcome (its own
        proposed / accepted counters are the caller's). `chain`: on a tree step, what the
        tree's top-1 chain alone accepted (-1: unknown)."""
        self.stats[f"steps_by_k.{k}"] += 1
        if proposed:  # per-token acceptance estimate for the goodput policy (EMA), per shape
            # a tree reaches depth k with fewer rejections than a chain: tree steps are the
            # population's tree evidence, and what their top-1 chains accepted is the
            # paired chain evidence of the same steps (goodput's tree gain: same text, both
            # shapes). That top-1 chain is also the request's chain evidence, so it stays
            # current on trees; without it (sampled rows) the chain evidence ages
            rejected = 1.0 if accepted < min(k, proposed) else 0.0
            _decay_add(self._pop[topk > 1], accepted, rejected)
            chain_ev = (accepted, rejected) if topk == 1 else \
                (chain, 1.0 if chain < k else 0.0) if chain >= 0 else None
            if chain_ev is None:
                _age(req)
            else:
                req.spec_alpha_num = ALPHA_DECAY * req.spec_alpha_num + chain_ev[0]
                req.spec_alpha_den = ALPHA_DECAY * req.spec_alpha_den + sum(chain_ev)
                if topk > 1:  # the chain population, and the paired evidence of trees
                    _decay_add(self._pop[0], *chain_ev)
                    _decay_add(self._pop[2], *chain_ev)
        if k:
            self.stats["tree_steps" if topk > 1 else "chain_steps"] += 1
            self.stats["proposed"] += proposed
            self.stats["accepted"] += accepted
            if topk > 1:  # per shape, and what the trees' top-1 chains alone accepted
                self.stats["tree_accepted"] += accepted
                self.stats["tree_top1_accepted"] += max(chain, 0)
            self.stats[f"accept_len.{accepted}"] += 1


# Per-token acceptance evidence of a request (accepted drafts, accepted + rejections) decays
# by this per step: per VERIFY step (recent text weighs most), and per plain step too, so a
# request the policy stopped speculating for (it read a hard stretch of text) drifts back
# to the population's acceptance and is tried again, instead of staying at K = 0 on stale
# evidence (on the H200, 73 of 721 steps at c = 1 were such plain steps).
ALPHA_DECAY = 0.9
POPULATION_DECAY = 0.99  # the same evidence over all requests, per request-step


def _decay_add(pop: list[float], accepted: float, rejected: float) -> None:
    """Population evidence [accepted, accepted + rejections], EMA per request-step."""
    pop[0] = POPULATION_DECAY * pop[0] + accepted
    pop[1] = POPULATION_DECAY * pop[1] + accepted + rejected


def _age(req: Request) -> None:
    """A step that brought no chain evidence for `req` (plain, or a tree): its chain
    acceptance evidence decays towards the population's."""
    req.spec_alpha_num *= ALPHA_DECAY
    req.spec_alpha_den *= ALPHA_DECAY


def _uniform(n_nodes: list[int]) -> int:
    """Nodes per request when every request verifies the same number, else 1."""
    return n_nodes[0] if len(set(n_nodes)) == 1 else 1
