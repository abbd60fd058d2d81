"""The contracts of one engine step, all pure CPU:

    StepPlan      what the step will do, decided by Scheduler.schedule() before anything is
                  allocated; nothing after planning changes it
    Layout        the step's device shape, fixed with the plan (ModelRunner.layout(plan))
    Speculation   the frozen speculation shape the scheduler plans with (sizes per K)
    StepResult    what the step produced, applied by Scheduler.commit(plan, result)

Data flow: Scheduler.schedule() -> StepPlan -> BatchBuilder.prepare (allocates
plan.num_slots) -> ModelRunner / SpecRunner -> StepResult -> Scheduler.commit.

Slots of one request in one step (the builder allocates them in this order):

    plan.num_slots[i] = num_nodes[i] + num_scratch[i]
    [ node 0 | node 1 .. node n-1 | scratch ... ]
      plain:  the step's tokens at positions prefix..prefix+n-1 (every one committed)
      VERIFY: the pending token, then the draft tokens (a chain's node j sits at position
              prefix+j); commit keeps the accepted nodes in position order and frees the
              rest and the draft's scratch (rollback by count)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gearshift.forward_batch import ForwardMode
from gearshift.request import Request


@dataclass(frozen=True, slots=True)
class Speculation:
    """The speculation shape the scheduler plans with; built once by the engine from the
    configured draft (speculative/sizing.py)."""

    num_draft_tokens: int  # the configured draft depth K: a step plans 0..K per request
    draft_topk: int  # the engine's tree width (1: chains only)
    num_nodes: Callable[[int, int], int]  # (K, topk) -> tokens one request verifies
    num_scratch: Callable[[int, int], int]  # (K, topk) -> draft scratch slots of one request
    # acceptance evidence over recent requests (accepted, accepted + rejections), and the
    # same from tree steps then their top-1 chains: the policy's priors
    population: Callable[[], tuple | None] = lambda: None  # PolicyView.population
    tree_population: Callable[[], tuple | None] = lambda: None
    draft_catches_up: bool = False  # the draft keeps state that plain steps leave behind
    # a draft row t that consumes token t + 1 (EAGLE-3): at the end of a cached prefix the
    # next token may differ, so a cache hit reuses one draft row less
    draft_row_shift: int = 0
    # prefill chunks may ride along in a chain VERIFY step's causal pass (eager engines)
    mixed: bool = False
    proposer: str = ""  # the engine's proposer (a hybrid's model part): eagle3 | draft | ...
    # a second proposer beside the model's (suffix decoding, "eagle3+suffix"): its deepest
    # draft, and per request the expected acceptance of each node of the draft it would
    # propose now (host work at planning time: the policy prices it); 0 / None: none
    suffix_draft_tokens: int = 0
    suffix_values: Callable[[list[Request], int], list[list[float]]] | None = None
    # told the proposer each priced request got (its pricing waits where suffix lost)
    suffix_chosen: Callable[[list[Request], list[str]], None] | None = None
    # host work while a VERIFY step's device runs: the running requests' suffix indexes
    # catch up on their committed tokens (off the next plan's critical path)
    suffix_index_ahead: Callable[[list[Request]], None] | None = None
    # the most tokens one VERIFY step may send (0: no cap): what the start-up profiled and
    # sized the KV cache beside (SpecRunner.max_verify_tokens); deeper suffix drafts are
    # cut to fit
    max_verify_tokens: int = 0
    deep_batch: int = 0  # the most decoding requests whose suffix drafts may go past K (0: any)

    def suffix_depth(self, batch: int) -> int:
        """The deepest suffix draft a step of `batch` decoding requests may verify (deeper
        chains than the model's K have graphs on batches up to deep_batch only)."""
        if self.deep_batch and batch > self.deep_batch:
            return min(self.suffix_draft_tokens, self.num_draft_tokens)
        return self.suffix_draft_tokens


@dataclass(frozen=True, slots=True)
class Layout:
    """The device shape of one step, chosen once per plan (ModelRunner.layout(plan), the
    one padding rule); BatchBuilder.prepare lays the batch out for it and ModelRunner.forward
    runs it (on `graph`'s CUDA graph, or eagerly when None). Padding uses the reserved
    dummy row 0 and slot 0 (runner/batch.py).

        kind     mode     pass                                    rows   tokens
        decode   DECODE   one token per request                   padded batch (= tokens)
        extend   EXTEND   prefill chunks (decoders as 1-token     max_num_seqs + 1 on a graph,
                          extends)                                 padded token bucket
        chain    VERIFY   causal extend over each request's       padded batch, padded rows
                          nodes (riders: their chunk)              x nodes on a graph
        mixed    VERIFY   chains of different K, one causal       padded batch + 1, token
                          extend padded to a token bucket          bucket
        tree     VERIFY   one query per node, tree attention      padded batch, rows x nodes
                          (draft trees, and chains on few rows)

    A VERIFY layout reserves `nodes` rows per request for the pending token and its drafts
    (the draft's node count); the proposer's tokens fill them on the device."""

    kind: str  # decode | extend | chain | mixed | tree
    rows: int  # per-request rows of the pass (real requests first, then padding)
    tokens: int  # token rows of the pass
    nodes: int = 1  # VERIFY: nodes per request (the draft tree's width; chains K_max + 1)
    graph: tuple | None = None  # the CUDA-graph key it runs on; None: eagerly, unpadded

    @property
    def padded(self) -> bool:
        return self.graph is not None


@dataclass(slots=True)
class StepPlan:
    """Every field is written by the scheduler while planning."""

    mode: ForwardMode  # DECODE when every request computes exactly its one pending token
    reqs: list[Request] = field(default_factory=list)  # batch order
    extend_lens: list[int] = field(default_factory=list)  # tokens computed per request
    prefix_lens: list[int] = field(default_factory=list)  # tokens already in the KV cache
    sample: list[bool] = field(default_factory=list)  # the chunk reaches the end: sample a token
    decoding: list[bool] = field(default_factory=list)  # computes its one pending token, samples
    # output index of the placeholder standing for the token this step samples (-1: none);
    # the placeholder's value is -(token_tag + batch index + 1) (engine/overlap.py)
    placeholders: list[int] = field(default_factory=list)
    token_tag: int = 0
    preempted: list[Request] = field(default_factory=list)  # sent back to waiting while planning
    failed: list = field(default_factory=list)  # StepOutputs of requests that failed admission
    # VERIFY steps (empty otherwise): K per request, at most the configured num_draft_tokens
    # (0: this request decodes plainly, or rides along with a prefill chunk), and the slots
    # each request's verification needs
    draft_lens: list[int] = field(default_factory=list)
    num_nodes: list[int] = field(default_factory=list)  # tokens verified: root + drafts
    num_scratch: list[int] = field(default_factory=list)  # the draft's own rows
    draft_topk: int = 1  # tree width of a VERIFY step: 1 = chains, > 1 = one draft tree each
    # a hybrid engine's proposer per request (its model's name, e.g. "eagle3", or "suffix";
    # "" where K = 0); empty: the engine's one proposer
    proposers: list[str] = field(default_factory=list)
    # the next step prefills too (a chunk stops short of its prompt's end, or the token
    # budget left requests waiting): the draft's pass over these chunks can wait for it
    prefill_continues: bool = False
    # how the engine runs the step (engine.py: one path for every mode): commit the step in
    # flight first (VERIFY steps draft from its tokens on the host; grammar masks need them),
    # and read this step's tokens before step() returns (VERIFY, or overlap scheduling off)
    commit_first: bool = False
    sync: bool = False
    # the draft (speculative/draft_follow.py): rows each request's draft consumes before it
    # proposes in this step (VERIFY: what it committed at K = 0 since it last drafted; empty:
    # none), and whether the draft follows the tokens this step commits (some K > 0 may come)
    draft_catch_up: list[int] = field(default_factory=list)
    draft_follows: bool = False
    layout: Layout | None = None  # set once planned by the engine (None: eager, unpadded)

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def model_free(self) -> bool:
        """A hybrid's step whose drafts all came from suffix decoding: no draft pass ran."""
        return bool(self.proposers) and all(p in ("", "suffix") for p in self.proposers)

    @property
    def num_tokens(self) -> int:
        """Tokens the plan moves forward (a VERIFY step's drafts are extra: num_nodes)."""
        return sum(self.extend_lens)

    @property
    def num_slots(self) -> list[int]:
        """KV slots BatchBuilder.prepare allocates per request."""
        if self.num_nodes:
            return [n + s for n, s in zip(self.num_nodes, self.num_scratch)]
        return list(self.extend_lens)

    @property
    def speculating(self) -> bool:
        return any(self.draft_lens)

    @property
    def is_empty(self) -> bool:
        return not self.reqs

    def add(self, req: Request, extend_len: int) -> None:
        self.reqs.append(req)
        self.extend_lens.append(extend_len)
        self.prefix_lens.append(req.num_computed_tokens)
        sample = req.num_computed_tokens + extend_len == req.num_tokens
        self.sample.append(sample)
        self.decoding.append(sample and extend_len == 1)


@dataclass(slots=True)
class StepResult:
    """What one step produced for each request of its plan (written by the runner that ran
    it; the engine fills `slots` from the batch)."""

    slots: list[list[int]]  # the slots BatchBuilder allocated: nodes, then draft scratch
    tokens: list[list[int]]  # tokens to emit: the sample, or accepted drafts + bonus
    # VERIFY: indices of the nodes whose KV is committed, in position order (the accepted
    # path); None: every node (plain steps, prefill chunks)
    kept: list[list[int]] | None = None

