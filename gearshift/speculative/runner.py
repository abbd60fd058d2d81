"""SpecRunner: the speculative stages of the engine's one step pipeline.

    VERIFY plan -> BatchBuilder.prepare (node + scratch slots, staged inputs)
      -> run(): draft catch-up -> proposer.propose -> DraftTree [B, N]        (device)
                -> target VERIFY over the valid nodes (verify_batch.py)        (device)
                -> penalties, grammar masks per node (verify_logits / _grammar.py)
                -> verification: accepted path + bonus per request (rejection
                   sampling, or coupled to the plain sampler: coupled.py)      (device)
                -> on graphs: the draft's follow-up over the accepted tokens,
                   laid out from the packed result (follow_up.py)              (device)
                -> before_sync() (the policy's next plan) -> one host sync (on the
                   result alone: the follow-up runs on while the host commits)
                -> StepResult (tokens, accepted node indices)
      -> Scheduler.commit (keep the path's slots, free the rest)
      -> after_commit(): the draft's rows move on (else the follow-up runs here, laid out
         on the host); acceptance counters
    plain plan -> ModelRunner.run -> after_plain(): the draft's state follows at K = 0

Data flow: Engine.step -> SpecRunner.run / after_commit (VERIFY plans), after_plain (plain).
"""

from __future__ import annotations

from itertools import accumulate

import torch

from gearshift.config import EngineConfig
from gearshift.policy.allocation import chain_gear
from gearshift.runner.batch import BatchBuilder, StepBatch
from gearshift.runner.graphs import mixed_verify_tokens
from gearshift.runner.model_runner import ModelRunner
from gearshift.scheduler.plan import Speculation, StepPlan, StepResult
from gearshift.speculative import coupled
from gearshift.speculative import verify_batch as vb
from gearshift.speculative import verify_grammar as vg
from gearshift.speculative import verify_logits as vl
from gearshift.speculative.acceptance import Acceptance, age
from gearshift.speculative.draft_follow import DraftFollower
from gearshift.speculative.proposers import create_proposer
from gearshift.speculative.proposers.base import ProposeContext
from gearshift.speculative.timing import VerifyTiming
from gearshift.speculative.verify import verify
from gearshift.speculative.verify_device import node_valid, pack, record_paths


class SpecRunner:
    def __init__(self, config: EngineConfig, runner: ModelRunner, builder: BatchBuilder,
                 feed=None) -> None:
        self.runner, self.builder = runner, builder
        self.proposer = create_proposer(config, runner)
        self.topk = config.draft_topk  # the widest tree a step may verify (1: chains only)
        self.num_draft_tokens = config.num_draft_tokens
        self.tree_nodes = config.verify_nodes if self.topk > 1 else 0
        self.capture = self.proposer.aux_layers if self.proposer.needs_features else ()
        self.draft_frac = self.proposer.cost_fraction(runner.model)  # a draft step / target step
        self.split_k_verify_below = 64  # (requests x kv heads) under which chains use split-K
        self.acceptance = Acceptance(tree=self.topk > 1)
        self.timing: VerifyTiming | None = None  # CUDA events of VERIFY steps (--step-trace)
        # `feed` (the engine's TokenFeed) resolves tokens of overlapped steps on the device
        self.follow = DraftFollower(self.proposer, runner, builder, self.num_draft_tokens, feed,
                                    every_token=config.enable_prefix_caching)
        self._last: tuple | None = None  # run()'s context for after_commit

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
        return self.proposer.scratch_slots(k if topk == 1 else self.num_draft_tokens, topk)

    def slots_needed(self, k: int, topk: int = 1) -> int:
        """KV slots a request needs for a step with draft length k (0 = plain decode) and
        tree width topk."""
        return self.nodes(k, topk) + self.scratch(k, topk)

    def speculation(self) -> Speculation:
        """The frozen shape the scheduler plans with. Without CUDA graphs, prefill chunks
        ride in a chain's causal verify pass, so that an arrival does not cost the decoders
        a step at K = 0; with graphs a step that prefills is a graphed mixed EXTEND step at
        K = 0 (it measured faster than riding chunks, docs/benchmarks.md)."""
        riders = self.topk == 1 and self.runner.shape_graphs is None
        return Speculation(
            num_draft_tokens=self.num_draft_tokens, draft_topk=self.topk,
            num_nodes=self.nodes, num_scratch=self.scratch,
            population=self.acceptance.population,
            tree_population=self.acceptance.tree_population,
            draft_catches_up=self.proposer.keeps_state,
            draft_row_shift=int(self.proposer.shifted_inputs),
            mixed=riders)

    def gear(self, plan: StepPlan) -> int:
        """The cost model's key of a planned step: K for chains (0 = plain decode), the
        draft depth + 1 for a tree step (policy/goodput.py). Chains of mixed K: the gear
        nearest their mean K (it verifies about as many tokens: CostModel.predict_verified)."""
        if not plan.speculating:
            return 0
        if plan.draft_topk > 1:
            return self.num_draft_tokens + 1
        return chain_gear(plan.draft_lens)

    def verified_tokens(self, n: int, tokens: int) -> int:
        """The tokens a chain VERIFY pass of n requests mixing K runs over, `tokens` of them
        real: its token bucket where it runs on one (no penalties, grammars or logprobs),
        else exactly those (goodput-request prices mixed steps with it)."""
        if self.runner.shape_graphs is None:
            return tokens
        bucket = mixed_verify_tokens(self.runner.decode_pad(n), tokens)
        return bucket if bucket <= self.runner.max_verify_graph_tokens else tokens

    def _bucketed(self, n_nodes: list[int], sb) -> bool:
        """Does a chain step of different lengths verify on a token-bucket graph? Not with
        penalties, grammars or logprobs (their per-node work assumes only the verified
        nodes in `flat`: those steps run eagerly), nor past the largest verify graph."""
        if len(set(n_nodes)) == 1 \
                or sb.penalties is not None or sb.grammar is not None or sb.logprobs is not None:
            return False
        return self.verified_tokens(len(n_nodes), sum(n_nodes)) != sum(n_nodes)

    @property
    def stats(self):
        return self.acceptance.stats

    def split_k_chains(self, b: int) -> bool:
        """Do a step's b chains verify with split-K tree attention (graphed only)? Few
        (request, kv head) pairs cannot fill the GPU: split-K spreads each prefix over the
        SMs; beyond that, causal extend reads each prefix once. Decided on the PADDED batch,
        the graph's shape: the warm-up runs every graph size exactly, and a 6-request step
        padded to 8 must replay what it captured at 8, not capture a new graph mid-run."""
        if self.runner.shape_graphs is None:
            return False
        rows = self.runner.decode_pad(b)
        return rows * self.runner.model.num_kv_heads < self.split_k_verify_below  # this rank's

    # ------------------------------------------------------------------ plain steps
    def after_plain(self, plan: StepPlan, aux: torch.Tensor | None) -> None:
        """After an EXTEND / DECODE step: the draft keeps what it needs of the tokens just
        computed, and the acceptance evidence of requests that decoded plainly ages."""
        self.follow.after_plain(plan, aux)
        for req, dec in zip(plan.reqs, plan.decoding):
            if dec:
                age(req)
        if any(plan.decoding):
            self.acceptance.age_population(sum(plan.decoding))

    def time_verify_steps(self) -> None:
        """Record CUDA events in every VERIFY step from now on (timing.py; --step-trace)."""
        self.timing = VerifyTiming()

    # ------------------------------------------------------------------ VERIFY steps
    @torch.inference_mode()
    def run(self, plan: StepPlan, batch: StepBatch, before_sync=None,
            planning_s: float = 0.0) -> StepResult:
        """Decoding requests verify their nodes; prefill chunks in the same plan ("riders",
        chains only) extend as usual in the same causal pass and sample at their end.
        `before_sync`: host work to do while the device runs, before the step's one sync;
        `planning_s`: the host time that planned the step (for the step trace)."""
        reqs, ks, topk = plan.reqs, plan.draft_lens, plan.draft_topk
        b = len(reqs)
        ride = [not d for d in plan.decoding]
        prefix = plan.prefix_lens
        node_slots = [s[:n] for s, n in zip(batch.slots, plan.num_nodes)]
        d, sb = batch.staged, batch.sampling
        depth = max(ks)
        n_max, s_max = max(plan.num_nodes), max(plan.num_scratch)
        # the draft catches up on rows committed while these requests ran at K = 0
        timing = self.timing
        if timing is not None:
            timing.mark(0, planning_s)
        self.follow.catch_up([r for r, k, rd in zip(reqs, ks, ride) if k and not rd])
        pb, lp = sb.penalties, sb.logprobs
        counts = self.runner.token_counts() if pb is not None and pb.use_counts else None
        if counts is not None:
            counts.reset(pb)  # rows given out this step, before the draft reads them
        n_draft = max(n for n, r in zip(plan.num_nodes, ride) if not r)  # not a chunk's length
        ctx = ProposeContext(reqs, ks, depth, topk, n_draft, d["roots"], d["prefix"], prefix,
                             d["rows"], d["scratch"].view(b, s_max), sb, counts)
        if timing is not None:
            timing.mark(1)
        tree, nodes_override = self.proposer.propose(ctx)
        if timing is not None:
            timing.mark(2)
        # grammars need the drafts on the host: copied now, walked while the target runs
        on_host = vg.TreeOnHost(tree) if sb.grammar is not None else None
        n_tree = tree.num_nodes  # a tree is smaller than its budget when K was capped
        n_nodes = nodes_override or [min(len(s), n_tree) if k else 1
                                     for s, k in zip(node_slots, ks)]
        # tokens each request sends through the target (a rider: its whole chunk)
        n_tokens = [len(s) if r else n for s, r, n in zip(node_slots, ride, n_nodes)]
        offsets = [0, *accumulate(n_tokens)][:b]  # first target token of each request
        per_row, pad_tok, k_dev, rows = vb.uniform(n_nodes), None, d["k"], None
        if topk == 1 and not any(ride) and self._bucketed(n_nodes, sb) \
                and not self.split_k_chains(b):
            # chains of different K: one causal extend over sum(K_i + 1) tokens, bucketed
            fb, flat, key, node_tok, pad_tok, k_dev = vb.mixed_chain_batch(
                self.runner, reqs, prefix, tree, node_slots, n_nodes, n_tree)
            slots_bn, per_row = None, n_tree
        elif topk == 1 and (any(ride) or not self.split_k_chains(b)):
            # chains verify as a causal extend over positions L..L+K (prefix read once)
            fb, flat, key, node_tok, rows = vb.chain_batch(self.runner, reqs, prefix, tree,
                                                           node_slots, n_nodes, n_tree, ride)
            slots_bn = None
        else:
            d2, pad = vb.stage_tree_nodes(self.runner, reqs, prefix, n_nodes, n_tree)
            flat = d2["flat"]
            slots_bn = d["node_slots"].view(b, n_max)[:, :n_tree] if n_max >= n_tree else \
                torch.nn.functional.pad(d["node_slots"].view(b, n_max), (0, n_tree - n_max))
            fb = vb.tree_batch(self.runner, tree, slots_bn, d2, depth, max(prefix), pad)
            key = ("verify-tree", fb.num_tokens, n_tree) if self.runner.shape_graphs is not None \
                and fb.num_tokens <= self.runner.max_verify_graph_tokens else None
            node_tok = None
        # [T(+pad), V]; with riders, the nodes' logits alone [nodes, V]
        logits_t, aux = self.runner.forward_all(fb, self.capture, graph_key=key, rows=rows)
        raw_t = logits_t
        if pb is not None:  # verification sees what a plain step would sample from
            logits_t = vl.penalise(pb, counts, logits_t, tree, flat, vl.node_rows(flat, node_tok),
                                   sb.steps, depth)
        if on_host is not None:
            masks = vg.node_masks(reqs, on_host, n_nodes, n_tree, self.runner.device)
            logits_t = vg.constrain(logits_t, masks, flat, vl.node_rows(flat, node_tok),
                                    banned=pb is not None and pb.banned is not None)
        # the tree path's accepted slots go to req_to_token on the device (a chain verified
        # as an extend recorded its nodes' slots while building the batch)
        record = None if slots_bn is None else (d["rows"], d["prefix"], slots_bn)
        if sb.all_greedy or sb.all_coupled:  # accept while the draft is the target's token
            target = logits_t.argmax(-1) if sb.all_greedy else coupled.row_targets(
                logits_t, vl.node_rows(flat, node_tok), flat, tree, sb)
            packed = vb.greedy_verify(self.runner, tree, target, flat, node_tok, k_dev, depth,
                                      record, graphed=key is not None, per_row=per_row,
                                      pad_tok=pad_tok)
        else:
            logits_t = logits_t[node_tok] if node_tok is not None else logits_t[: flat.shape[0]]
            logits = torch.zeros(b * n_tree, logits_t.shape[-1], device=logits_t.device)
            logits[flat] = logits_t
            valid = node_valid(flat, k_dev, tree.depths)
            res = verify(tree, valid, logits.view(b, n_tree, -1), sb, depth, topk)
            if record is not None:
                record_paths(self.runner.kv.req_to_token, *record, res)
            packed = pack(res)
        if counts is not None:
            vl.record(pb, counts, packed, depth)
        if lp is not None and lp.sampled:
            vl.path_logprobs(lp, raw_t, flat, vl.node_rows(flat, node_tok), packed, n_tree, depth)
            lp.start_copy()  # read after the sync below
        if timing is not None:
            timing.mark(3)
        read = self._read_later(packed)
        early = self._follow_early(plan, packed, d, offsets, aux)
        if before_sync is not None:
            before_sync()
        packed = read() if read is not None else packed.tolist()  # the step's one host sync
        if timing is not None:
            timing.read()
        if self.follow.catch_up_rows:  # what leaving K = 0 cost (its events are done now)
            self.stats["catch_up_rows"] += self.follow.catch_up_rows
            self.stats["catch_up_ms"] += self.follow.catch_up_ms()
        tokens, paths = [], []
        for i in range(b):
            if ride[i]:  # the whole chunk stays; its last token's sample only if it ends the prompt
                paths.append(list(range(len(node_slots[i]))))
                tokens.append(packed[i][depth + 2:][:1] if plan.sample[i] else [])
                continue
            a = packed[i][0]
            paths.append(packed[i][1:depth + 2][:a + 1])
            tokens.append(packed[i][depth + 2:][:a + 1])
            if ks[i]:  # the request's own counters before commit: its outputs carry them
                reqs[i].spec_proposed += n_nodes[i] - 1
                reqs[i].spec_accepted += a
        self._last = (aux, offsets, n_nodes, packed, depth, early)
        return StepResult(batch.slots, tokens, kept=paths)

    def _read_later(self, packed: torch.Tensor):
        """On CUDA: start copying the step's result to the host and mark it, so that the
        sync waits for it alone and not for device work launched after it. -> the read."""
        if not packed.is_cuda:
            return None
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def read() -> list:
            done.synchronize()
            return host.tolist()
        return read

    def _groups(self, plan: StepPlan) -> tuple[list[int], list[int]]:
        """Batch rows whose draft extends over the accepted tokens (it is current for them)
        and rows whose kept tokens' features are stored for a later catch-up. With the
        prefix cache every committed token's features are kept (a cache hit's draft catches
        up from them), so the finished and opted-out requests' too."""
        reqs, prefix = plan.reqs, plan.prefix_lens
        live = [i for i, r in enumerate(reqs) if not r.is_finished and r.params.speculative]
        extend = [i for i in live if reqs[i].draft_rows == prefix[i]]
        store = list(range(len(reqs))) if self.follow.every_token else \
            [i for i in live if reqs[i].draft_rows != prefix[i]]
        return extend, store

    def _follow_early(self, plan: StepPlan, packed: torch.Tensor, staged: dict,
                      offsets: list[int], aux: torch.Tensor | None) -> list[int] | None:
        """Launch the draft's follow-up over the accepted tokens before the host reads them,
        laid out on the device (follow_up.py), where its graphed shape applies: the draft
        runs while the host commits. Requests this step finishes are followed too (their
        slots are freed after, in stream order). Graphed steps only, which carry no prefill
        chunk (speculation()). -> the rows extended, or None."""
        if not self.follow.follows_early(plan):
            return None
        extend, store = self._groups(plan)
        self.follow.follow_accepted(plan, extend, store, packed, staged, offsets, aux)
        return extend

    def after_commit(self, plan: StepPlan, result: StepResult) -> None:
        """The draft follows the committed tokens: it extends over the accepted ones where it
        is current, else their features are stored for a later catch-up (unless run()
        launched both already: then only the draft's rows move); then the step's acceptance
        is recorded (while the device runs the draft)."""
        aux, offsets, n_nodes, packed, depth, early = self._last
        self._last = None
        reqs, prefix = plan.reqs, plan.prefix_lens
        if early is not None:
            for i in early:
                reqs[i].draft_rows = prefix[i] + len(result.kept[i])
        else:  # both groups are split before either runs: extending moves draft_rows
            extend, store = self._groups(plan)
            for group, stage in ((extend, self.follow.extend), (store, self.follow.store)):
                stage([reqs[i] for i in group], [prefix[i] for i in group],
                      [len(result.kept[i]) for i in group], aux,
                      [offsets[i] + j for i in group for j in result.kept[i]])
        self.acceptance.record_step(plan.draft_lens)
        for i, d in enumerate(plan.decoding):
            if d:
                self.acceptance.record(reqs[i], plan.draft_lens[i], plan.draft_topk,
                                       n_nodes[i] - 1, packed[i][0], packed[i][2 * depth + 3])
