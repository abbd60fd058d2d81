"""Policy contract. A policy is pure CPU: it sees a PolicyView (the running requests of a
decode step, the queue) and returns a draft length K per request (0 = plain decode).
The scheduler asks it BEFORE anything is allocated; the plan then fixes K for the step.

Data flow: Scheduler.schedule() -> Policy.plan(view) -> StepPlan.draft_lens;
SpecRunner (a VERIFY step, before its sync) -> Scheduler.prepare_next -> Policy.prepare(view).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gearshift.policy.cost import CostModel
from gearshift.request import Request


@dataclass(slots=True)
class PolicyView:
    requests: list[Request]  # the decode batch, in batch order
    num_waiting: int  # queued requests
    num_draft_tokens: int  # the configured draft depth K (graphs and buffers exist up to it)
    # chain acceptance evidence over recent VERIFY outcomes of all requests (SpecRunner),
    # per sampling class: ((accepted drafts, accepted + rejections) of greedy requests, the
    # same of sampled ones), EMA; the policy's prior for a request with little evidence of
    # its own. None: not measured
    population: tuple[tuple[float, float], tuple[float, float]] | None = None
    topk: int = 1  # the engine's tree width (tree_width): > 1 = a step may verify draft trees
    tree_population: tuple[float, float] | None = None  # the same evidence from tree steps
    # the draft keeps per-request state (KV) that plain steps leave behind: a request's
    # next VERIFY step first catches it up over num_computed_tokens - draft_rows rows
    draft_catches_up: bool = False
    # a hybrid engine (Speculation.suffix_values): per request, the expected acceptance of
    # each node of its suffix draft as it stands now (empty: no match); None: no suffix
    suffix_values: list[list[float]] | None = None
    suffix_draft_tokens: int = 0  # the deepest suffix draft a step may verify


class Policy(ABC):
    drafts = True  # whether it ever plans K > 0; if not, the draft need not follow tokens
    # it reads PolicyView.suffix_values (a hybrid's): only then are they computed (host work)
    prices_suffix = False
    topk: int | None = None  # tree width of its speculative steps; None = the engine's
    # the step-time model it prices gears with (goodput): the start-up warm-up's measured
    # steps go there; None: the policy prices nothing
    cost: CostModel | None = None
    # what the engine's stats and the benches read (a policy that prices nothing keeps these)
    switches: int = 0  # gear changes (probes and explorations aside)
    reused: int = 0  # plans that kept the running gear without scoring
    last_prediction: Mapping[str, object] = MappingProxyType({})  # the last scored plan's
    # "verify" / "plain" -> [measured ms, predicted ms, steps], summed over observed steps
    prediction_log: Mapping[str, list] = MappingProxyType({})
    # what a policy wrapping this one (the hybrid) prices with: its deepest gear (None: the
    # view's), its per-request acceptance prior (goodput's GearScorer) and its step shapes
    num_draft_tokens: int | None = None
    scorer = None
    verify_tokens = None  # (rows, verified tokens) -> the graph's tokens; None: unpadded

    def pad(self, bs: int) -> int:
        """Batch size -> the batch size its step runs at (a graph's). Default: as is."""
        return bs

    def step_topk(self, view: PolicyView) -> int:
        """Tree width of the step just planned for `view` (asked right after plan(); 1 =
        chains). A step verifies either chains or trees, never both."""
        return view.topk if self.topk is None else min(self.topk, view.topk)

    def step_proposers(self, view: PolicyView) -> list[str] | None:
        """The proposer of each request of the step just planned (asked right after plan()
        and step_topk(); the model's name, e.g. "eagle3", or "suffix"); None: the engine's
        one proposer."""
        return None

    def prepare(self, view: PolicyView) -> None:
        """Called while the device runs a VERIFY step, before the host waits for it, with
        that step's decoding requests: work for the next plan() done here is off the step's
        critical path (the host is idle until the sync). Default: nothing."""
        return None

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float,
                ks: list[int] | None = None) -> None:
        """A step at gear k (batch size bs, ctx_tokens of context) took `ms`; `ks`: a chain
        step's K per request where they differ. Default: nothing (the policy prices
        nothing)."""
        return None

    def observe_model_free(self, k: int, bs: int, ctx_tokens: int, ms: float,
                           ks: list[int] | None = None) -> None:
        """A VERIFY step at gear k whose drafts all came from a proposer with no model (a
        hybrid's suffix decoding: no draft pass ran) took `ms`. Default: as any step."""
        self.observe(k, bs, ctx_tokens, ms, ks)

    def observe_catch_up(self, rows: int, ms: float) -> None:
        """A VERIFY step's draft caught up over `rows` rows in `ms`. Default: nothing."""
        return None

    @abstractmethod
    def plan(self, view: PolicyView) -> list[int]:
        """Draft length per request of view.requests, each in [0, view.num_draft_tokens]."""

    @staticmethod
    def eligible(req: Request) -> bool:
        """Requests that opted out (SamplingParams(speculative=False)) never speculate."""
        return req.params.speculative
