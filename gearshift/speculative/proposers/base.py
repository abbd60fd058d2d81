"""Proposer contract: keep the draft's state current over committed tokens
(`draft_extend`), and propose a DraftTree for the speculating requests of a step.

Data flow: SpecRunner -> Proposer.draft_extend (after every commit) and
Proposer.propose (VERIFY steps, before the target runs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from gearshift.forward_batch import ForwardBatch
from gearshift.request import Request
from gearshift.runner.penalties import TokenCounts
from gearshift.runner.sampler import SamplingBatch
from gearshift.speculative.tree import DraftTree


@dataclass(slots=True)
class ProposeContext:
    reqs: list[Request]  # the VERIFY batch, in order (K may be 0 for some)
    draft_lens: list[int]  # K per request
    max_depth: int  # max(draft_lens)
    topk: int
    num_nodes: int  # nodes per speculating request, root included
    roots: torch.Tensor  # [B] pending tokens (device)
    prefix_lens: torch.Tensor  # [B] committed tokens L (device)
    prefix_lens_cpu: list[int]
    rows: torch.Tensor  # [B] req_to_token rows (device)
    scratch: torch.Tensor  # [B, S] scratch slots (device; 0 = dummy for idle requests)
    sampling: SamplingBatch
    counts: TokenCounts | None = None  # the penalties' token counts (sampling.penalties)
    proposers: list[str] | None = None  # a hybrid's proposer per request (plan.proposers)


class Proposer(ABC):
    needs_features = False  # EAGLE-3: the draft consumes target hidden states
    aux_layers: tuple[int, ...] = ()
    shifted_inputs = False  # draft row t consumes token t+1 (EAGLE) instead of token t
    graph_extend = False  # draft_extend can be captured for padded 1-token-per-row batches
    keeps_state = True  # the draft has KV (and a seed) to keep current over committed tokens
    # set by the start-up warm-up (engine/warmup.py) while it runs: a proposer that may draft
    # fewer tokens than planned (no match) drafts them all, so that every step shape is
    # captured and timed at its real size (model proposers always do)
    full_drafts = False

    def weights(self) -> torch.nn.Module | None:
        """The draft's own model (its weights count in the memory profile); None: no model."""
        return None

    def cost_fraction(self, target: torch.nn.Module) -> float:
        """Cost of one draft step relative to one target step (a prior for the policy)."""
        own = self.weights()
        if own is None:
            return 0.0
        return sum(p.numel() for p in own.parameters()) / sum(p.numel() for p in target.parameters())

    @abstractmethod
    def scratch_slots(self, k: int, topk: int) -> int:
        """KV slots one request needs for draft rows while proposing K tokens."""

    def draft_extend(self, fb: ForwardBatch, features: torch.Tensor | None) -> None:  # noqa: B027
        """Run the draft over newly committed rows (extend layout over owned slots).
        Stateless proposers (n-gram) keep nothing, so the default does nothing."""

    def store_features(self, slots: torch.Tensor, aux: torch.Tensor) -> None:  # noqa: B027
        """Keep target features [T, F] of tokens at KV `slots` [T] until the draft catches up
        on them (EAGLE-3); proposers without features keep nothing."""

    def stored_features(self) -> torch.Tensor | None:
        """The feature store, indexed by KV slot (None: no features)."""
        return None

    def resize_slots(self, num_slots: int) -> None:  # noqa: B027
        """Reallocate what the draft keeps per KV slot (its K/V, EAGLE-3's features) for
        `num_slots` slots, contents dropped: the start-up memory profile sizes the cache.
        Stateless proposers (n-gram) keep nothing per slot."""

    def reset_cache(self) -> None:  # noqa: B027
        """Forget what earlier requests' outputs taught the proposer (suffix decoding: its
        output cache), as a benchmark point that starts cold does; model proposers keep
        nothing across requests."""

    @abstractmethod
    def propose(self, ctx: ProposeContext) -> tuple[DraftTree, list[int] | None]:
        """-> (tree [B, N], nodes per request or None = all). Device work, no host sync."""

