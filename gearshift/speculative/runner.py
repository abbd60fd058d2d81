"""SpecRunner: the speculative stages of the engine's one step pipeline.

    VERIFY plan + Layout -> BatchBuilder.prepare (node + scratch slots, staged inputs)
      -> run(): draft catch-up -> proposer.propose -> DraftTree [B, N]        (device)
                -> the target pass laid out while the draft runs, rows reserved
                   for the drafts (StepBatch.lay_out_target: verify_layout.py)
                -> fill_drafts -> ModelRunner.forward: the target pass        (device)
                -> penalties, grammar masks per node (verify_logits / _grammar.py)
                -> verification: accepted path + bonus per request (rejection
                   sampling, or coupled to the plain sampler: coupled.py)      (device)
                -> on graphs: the draft's follow-up over the accepted tokens,
                   laid out from the packed result (follow_up.py)              (device)
                -> before_sync() (the policy's next plan, suffix decoding's indexes
                   catching up) -> one host sync (on the
                   result alone: the follow-up runs on while the host commits)
                -> StepResult (tokens, accepted node indices)
      -> Scheduler.commit (keep the path's slots, free the rest)
      -> after_commit(): the draft's rows move on (else the follow-up runs here, laid out
         on the host); acceptance counters
    plain plan -> ModelRunner.forward -> after_plain(): the draft's state follows at K = 0

Data flow: Engine.step -> SpecRunner.run / after_commit (VERIFY plans), after_plain (plain).
"""

from __future__ import annotations

import torch

from gearshift.config import EngineConfig
from gearshift.policy.allocation import chain_gear
from gearshift.runner.batch import BatchBuilder, StepBatch
from gearshift.runner.layout import DEEP_ROWS, split_k
from gearshift.runner.model_runner import ModelRunner
from gearshift.runner.staging import to_device
from gearshift.runner.verify_layout import fill_drafts
from gearshift.scheduler.plan import Speculation, StepPlan, StepResult
from gearshift.speculative import coupled
from gearshift.speculative import verify_grammar as vg
from gearshift.speculative import verify_logits as vl
from gearshift.speculative.acceptance import Acceptance, age
from gearshift.speculative.draft_follow import DraftFollower
from gearshift.speculative.proposers import create_proposer
from gearshift.speculative.proposers.base import ProposeContext
from gearshift.speculative.timing import VerifyTiming
from gearshift.speculative.tree import ancestor_mask
from gearshift.speculative.verify import verify
from gearshift.speculative.verify_device import greedy_verify, node_valid, pack, record_paths


class SpecRunner:
    def __init__(self, config: EngineConfig, runner: ModelRunner, builder: BatchBuilder,
                 feed=None) -> None:
        self.runner, self.builder = runner, builder
        self.proposer = create_proposer(config, runner)
        self.topk = config.tree_width  # the widest tree a step may verify (1: chains only)
        self.num_draft_tokens = config.num_draft_tokens
        # a hybrid ("eagle3+suffix"): suffix drafts beside the model's, up to their own depth
        self.proposer_name = config.model_algorithm
        self.suffix_draft_tokens = config.suffix_draft_tokens if config.hybrid else 0
        self.tree_nodes = config.verify_nodes if self.topk > 1 else 0
        self.capture = self.proposer.aux_layers if self.proposer.needs_features else ()
        self.draft_frac = self.proposer.cost_fraction(runner.model)  # a draft step / target step
        self.acceptance = Acceptance(tree=self.topk > 1)
        self.timing: VerifyTiming | None = None  # CUDA events of VERIFY steps (--step-trace)
        # `feed` (the engine's TokenFeed) resolves tokens of overlapped steps on the device
        self.follow = DraftFollower(self.proposer, runner, builder, self.num_draft_tokens, feed,
                                    every_token=config.enable_prefix_caching)
        self._last: tuple | None = None  # run()'s context for after_commit
        runner.draft_nodes = self.draft_nodes  # a VERIFY layout's nodes per request

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

    def draft_nodes(self, depth: int, topk: int) -> int:
        """Nodes per request of the draft a step of this depth (its deepest K) and width
        makes: a chain's K + 1; a tree's best `verify_nodes - 1` of its candidates (topk
        at depth 1, topk^2 at each deeper one: proposers/expand.py) and the root."""
        if topk == 1:
            return depth + 1
        return 1 + min(self.tree_nodes - 1, topk + (depth - 1) * topk * topk)

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
            mixed=riders, proposer=self.proposer_name,
            suffix_draft_tokens=self.suffix_draft_tokens,
            suffix_values=self.proposer.price if self.suffix_draft_tokens else None,
            suffix_chosen=self.proposer.chosen if self.suffix_draft_tokens else None,
            suffix_index_ahead=self.proposer.index_ahead if self.suffix_draft_tokens else None,
            max_verify_tokens=self.max_verify_tokens(), deep_batch=DEEP_ROWS)

    def max_verify_tokens(self) -> int:
        """A hybrid's cap on one VERIFY step's tokens, what the memory profile's largest
        VERIFY steps ran: max_num_seqs requests at the model's widest shape, or up to
        DEEP_ROWS of them at the deepest suffix chain; 0 where no draft goes deeper."""
        if self.suffix_draft_tokens <= self.num_draft_tokens:
            return 0
        k, n = self.num_draft_tokens, self.runner.config.max_num_seqs
        return max(n * max(self.nodes(k, 1), self.nodes(k, self.topk)),
                   min(n, DEEP_ROWS) * self.nodes(self.suffix_draft_tokens, 1))

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
        bucket = self.runner.verify_bucket(self.runner.decode_pad(n), tokens)
        return bucket if bucket <= self.runner.max_verify_graph_tokens else tokens

    @property
    def stats(self):
        return self.acceptance.stats

    def split_k_chains(self, b: int) -> bool:
        """Do a step's b chains verify with split-K tree attention? (runner/layout.py)"""
        return split_k(self.runner, b)

    # ------------------------------------------------------------------ plain steps
    def after_plain(self, plan: StepPlan, aux: torch.Tensor | None) -> None:
        """After an EXTEND / DECODE step: the draft keeps what it needs of the tokens just
        computed, and the acceptance evidence of requests that decoded plainly ages."""
        self.follow.after_plain(plan, aux)
        greedy = sampled = 0
        for req, dec in zip(plan.reqs, plan.decoding):
            if dec:
                age(req)
                if req.params.greedy:
                    greedy += 1
                else:
                    sampled += 1
        if greedy or sampled:
            self.acceptance.age_population(greedy, sampled)

    def time_verify_steps(self) -> None:
        """Record CUDA events in every VERIFY step from now on (timing.py; --step-trace)."""
        self.timing = VerifyTiming()

    # ------------------------------------------------------------------ VERIFY steps
    @torch.inference_mode()
    def run(self, plan: StepPlan, batch: StepBatch, before_sync=None,
            planning_s: float = 0.0) -> StepResult:
        """Draft, then the target's pass over the rows the batch reserved for the drafts,
        then verification; prefill chunks in the same plan ("riders", eager chains only)
        extend as usual in the same causal pass and sample at their end. `before_sync`:
        host work to do while the device runs, before the step's one sync; `planning_s`:
        the host time that planned the step (for the step trace)."""
        d, sb, timing = batch.staged, batch.sampling, self.timing
        if timing is not None:
            timing.mark(0, planning_s)
        self.follow.catch_up(plan)  # the rows the plan says each draft must consume first
        pb = sb.penalties
        counts = self.runner.token_counts() if pb is not None and pb.use_counts else None
        if counts is not None:
            counts.reset(pb)  # rows given out this step, before the draft reads them
        if timing is not None:
            timing.mark(1)
        depth = self._depth(plan, batch)
        tree, found = self._propose(plan, batch, counts, depth)
        batch.lay_out_target()  # its host work while the device drafts
        vp = batch.verify
        n_nodes, k = (vp.n_nodes, vp.k) if found is None else self._found(found, batch, tree)
        if timing is not None:
            timing.mark(2)
        # grammars need the drafts on the host: copied now, walked while the target runs
        on_host = vg.TreeOnHost(tree) if sb.grammar is not None else None
        fill_drafts(batch.forward, vp, tree.tokens, tree.depths,
                    self._ancestors(tree, vp, depth), self.runner.max_positions)
        logits, aux = self.runner.forward(batch)  # [T(+pad), V]; riders: the nodes' alone
        masks = None if on_host is None else vg.node_masks(
            plan.reqs, on_host, n_nodes, tree.num_nodes, self.runner.device)
        packed = self._verify(plan, batch, tree, logits, k, counts, masks, depth)
        if timing is not None:
            timing.mark(3)
        read = self._read_later(packed)
        early = self._follow_early(plan, packed, d, vp.offsets, aux, depth)
        if before_sync is not None:
            before_sync()
        packed = read() if read is not None else packed.tolist()  # the step's one host sync
        if timing is not None:
            timing.read()
        if self.follow.catch_up_rows:  # what leaving K = 0 cost (its events are done now)
            self.stats["catch_up_rows"] += self.follow.catch_up_rows
            self.stats["catch_up_ms"] += self.follow.catch_up_ms()
        self._last = (aux, vp.offsets, n_nodes, packed, depth, early)
        return self._result(plan, batch, packed, n_nodes, depth)

    @staticmethod
    def _depth(plan: StepPlan, batch: StepBatch) -> int:
        """The step's draft depth: its deepest K, or for chains its layout's (a deep suffix
        chain pads to the next deep depth: ModelRunner.chain_depth)."""
        return max(plan.draft_lens) if plan.draft_topk > 1 else batch.layout.nodes - 1

    def _propose(self, plan: StepPlan, batch: StepBatch, counts, depth: int):
        """The draft tree [B, N] of the step, and the nodes a host proposer found per
        request (None: every planned one)."""
        d, b = batch.staged, plan.batch_size
        ctx = ProposeContext(plan.reqs, plan.draft_lens, depth, plan.draft_topk,
                             max(x for x, dec in zip(plan.num_nodes, plan.decoding) if dec),
                             d["roots"], d["prefix"], plan.prefix_lens, d["rows"],
                             d["scratch"].view(b, max(plan.num_scratch)), batch.sampling, counts,
                             plan.proposers if self.suffix_draft_tokens else None)
        return self.proposer.propose(ctx)

    @staticmethod
    def _found(found: list[int], batch: StepBatch, tree) -> tuple[list[int], torch.Tensor]:
        """A host proposer may find fewer nodes than planned: the layout stays, its nodes
        past them are masked. -> the nodes each request verifies, its drafts (device)."""
        k = to_device([x - 1 for x in found], torch.long, tree.tokens.device)
        return [min(x, batch.layout.nodes) for x in found], k

    @staticmethod
    def _ancestors(tree, vp, depth: int) -> torch.Tensor | None:
        """The tree's ancestor mask, where the pass attends over it (a tree layout)."""
        if vp.tree_index is None or tree.ancestors is not None:
            return tree.ancestors
        return ancestor_mask(tree.parents, depth)

    def _verify(self, plan: StepPlan, batch: StepBatch, tree, logits_t: torch.Tensor,
                k: torch.Tensor, counts, masks, depth: int) -> torch.Tensor:
        """Accepted paths from the target's logits -> packed [B, 2 * depth + 3] (device)."""
        sb, vp, d = batch.sampling, batch.verify, batch.staged
        pb, lp, n_tree = sb.penalties, sb.logprobs, tree.num_nodes
        flat = vp.flat
        # each node's logits row: for per-node work and coupled targets (greedy reads none)
        rows_t = vl.node_rows(flat, vp.node_tok) if pb is not None or masks is not None \
            or lp is not None or not sb.all_greedy else None
        raw_t = logits_t
        if pb is not None:  # verification sees what a plain step would sample from
            logits_t = vl.penalise(pb, counts, logits_t, tree, flat, rows_t, sb.steps, depth)
        if masks is not None:
            logits_t = vg.constrain(logits_t, masks, flat, rows_t,
                                    banned=pb is not None and pb.banned is not None)
        # the tree path's accepted slots go to req_to_token on the device (a chain verified
        # as an extend recorded its nodes' slots while the batch was prepared)
        record = None if vp.slots is None else (d["rows"], d["prefix"], vp.slots)
        if sb.all_greedy or sb.all_coupled:  # accept while the draft is the target's token
            target = logits_t.argmax(-1) if sb.all_greedy else coupled.row_targets(
                logits_t, rows_t, flat, tree, sb)
            packed = greedy_verify(self.runner, tree, target, flat, vp.node_tok, k, depth,
                                   record, batch.layout, vp.per_row, vp.pad_tok)
        else:
            logits_t = logits_t[vp.node_tok] if vp.node_tok is not None \
                else logits_t[: flat.shape[0]]
            logits = torch.zeros(plan.batch_size * n_tree, logits_t.shape[-1],
                                 device=logits_t.device)
            logits[flat] = logits_t
            valid = node_valid(flat, k, tree.depths)
            res = verify(tree, valid, logits.view(plan.batch_size, n_tree, -1), sb, depth,
                         plan.draft_topk)
            if record is not None:
                record_paths(self.runner.kv.req_to_token, *record, res)
            packed = pack(res)
        if counts is not None:
            vl.record(pb, counts, packed, depth)
        if lp is not None and lp.sampled:
            vl.path_logprobs(lp, raw_t, flat, rows_t, packed, n_tree, depth)
            lp.start_copy()  # read after the step's sync
        return packed

    def _result(self, plan: StepPlan, batch: StepBatch, packed: list, n_nodes: list[int],
                depth: int) -> StepResult:
        """The step's tokens and kept nodes per request, from the packed result (host)."""
        tokens, paths = [], []
        for i, req in enumerate(plan.reqs):
            if not plan.decoding[i]:  # a chunk stays whole; its last token's sample only
                paths.append(list(range(plan.num_nodes[i])))  # if it ends the prompt
                tokens.append(packed[i][depth + 2:][:1] if plan.sample[i] else [])
                continue
            a = packed[i][0]
            paths.append(packed[i][1:depth + 2][:a + 1])
            tokens.append(packed[i][depth + 2:][:a + 1])
            if plan.draft_lens[i]:  # the request's own counters before commit: its outputs
                req.spec_proposed += n_nodes[i] - 1  # carry them
                req.spec_accepted += a
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
                      offsets: list[int], aux: torch.Tensor | None, depth: int
                      ) -> list[int] | None:
        """Launch the draft's follow-up over the accepted tokens before the host reads them,
        laid out on the device (follow_up.py), where its graphed shape applies: the draft
        runs while the host commits. Requests this step finishes are followed too (their
        slots are freed after, in stream order). Graphed steps only, which carry no prefill
        chunk (speculation()): K_max + 1 tokens a request, or a deep suffix chain's depth +
        1 (captured by the warm-up). -> the rows extended, or None."""
        width = max(depth, self.num_draft_tokens) + 1
        if depth > self.num_draft_tokens and depth not in self.runner.deep_depths:
            return None
        if not self.follow.follows_early(plan, width):
            return None
        extend, store = self._groups(plan)
        self.follow.follow_accepted(plan, extend, store, packed, staged, offsets, aux, width)
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
        # a suffix draft's outcome is no evidence of the model's acceptance (its own
        # calibration takes it: proposers/suffix_price.py)
        suffix = [p == "suffix" and self.suffix_draft_tokens > 0 for p in plan.proposers] \
            or [False] * len(reqs)
        for i, d in enumerate(plan.decoding):
            if d:
                self.acceptance.record(reqs[i], plan.draft_lens[i], plan.draft_topk,
                                       n_nodes[i] - 1, packed[i][0], packed[i][2 * depth + 3],
                                       evidence=not suffix[i])
        if self.suffix_draft_tokens:
            self.proposer.observe(plan, n_nodes, [row[0] for row in packed])
