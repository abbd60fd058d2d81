"""The draft's follow-up over a VERIFY step's accepted tokens, laid out on the device from
the step's packed result and launched before the host reads that result: the draft
extends (and the kept tokens' features are stored) while the host commits the step and
plans the next one. Laid out on the host instead, it would wait for the sync and then run
with the device idle behind the host's loop over the requests.

    packed [B, 2 * D + 4] (verify_device.pack: accepted a, path nodes [D + 1], tokens)
      -> each request of a group, W = K_max + 1 columns (the width of the graphed
         draft-extend the warm-up captured), column j <= a: input id (root, tokens)[j +
         shift], KV slot = slot of path node j, feature row = target row of path node j;
         columns past a: 0 (dummy slot 0: only padding queries, which come after the real
         ones, see them)
      -> a draft-extend batch (positions prefix + j) padded to a decode graph size with
         dummy rows on row 0; each row's logits index its last accepted column

The host sets each request's draft_rows (prefix + a + 1) once it has read a.

Data flow: SpecRunner.run (after verification, before the sync) -> accepted() ->
DraftFollower.follow_accepted -> extend_batch() -> proposer.draft_extend / store_features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift.forward_batch import ForwardBatch, ForwardMode


@dataclass(slots=True)
class Accepted:
    """What the draft follows for a group of g requests, on the device."""

    ids: torch.Tensor  # [g, W] input ids
    slots: torch.Tensor  # [g, W] int64 KV slots (0 past the accepted path)
    feats: torch.Tensor  # [g, W] int64 rows of the target's features (0 past the path)
    count: torch.Tensor  # [g] int64 columns taken: a + 1


def accepted(packed: torch.Tensor, index: torch.Tensor, roots: torch.Tensor,
             node_slots: torch.Tensor, offsets: torch.Tensor, width: int,
             shift: int) -> Accepted:
    """The group `index` ([g] batch rows) of a step: packed [B, 2D + 4], roots [B], node
    slots [B, N], offsets [B] (each request's first target row); `shift`: 1 where draft
    row t consumes token t + 1 (EAGLE-3), else 0."""
    d1 = (packed.shape[1] - 2) // 2  # D + 1
    p = packed.index_select(0, index)
    a = p[:, 0]
    cols = torch.arange(width, device=p.device)
    valid = cols[None, :] <= a[:, None]  # [g, W]
    path = _columns(p[:, 1:1 + d1], width).clamp(0, node_slots.shape[1] - 1)
    seq = torch.cat([roots.index_select(0, index)[:, None], p[:, 1 + d1:1 + 2 * d1]], 1)
    ids = _columns(seq[:, shift:], width)
    slots = node_slots.index_select(0, index).gather(1, path)
    feats = offsets.index_select(0, index)[:, None] + path
    zero = torch.zeros((), dtype=torch.long, device=p.device)
    return Accepted(torch.where(valid, ids, zero), torch.where(valid, slots, zero),
                    torch.where(valid, feats, zero), a + 1)


def extend_batch(acc: Accepted, rows: torch.Tensor, prefix: torch.Tensor,
                 prefix_cpu: list[int], padded: int) -> ForwardBatch:
    """A DRAFT_EXTEND batch of the group's W columns each, padded to `padded` rows with
    dummy requests (row 0, prefix 0, input 0, slot 0); rows, prefix: [g] device."""
    g, width = acc.ids.shape
    pad = padded - g
    dev = acc.ids.device

    def more(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros((pad, *t.shape[1:]))]) if pad else t

    prefix, rows = more(prefix.long()), more(rows.long())
    cols = torch.arange(width, device=dev)
    start = torch.arange(padded, device=dev) * width
    last = start + torch.cat([acc.count - 1, acc.count.new_zeros(pad)])
    host_prefix = list(prefix_cpu) + [0] * pad
    seq = [x + width for x in host_prefix]
    return ForwardBatch(
        mode=ForwardMode.DRAFT_EXTEND, batch_size=padded, padded_batch_size=padded,
        num_tokens=padded * width, input_ids=more(acc.ids).flatten(),
        positions=(prefix[:, None] + cols).flatten(), out_cache_loc=more(acc.slots).flatten(),
        req_pool_indices=rows, seq_lens=(prefix + width).int(),
        extend_lens=torch.full((padded,), width, dtype=torch.int32, device=dev),
        extend_start_loc=start.int(), prefix_lens=prefix.int(), logits_indices=last,
        seq_lens_cpu=seq, extend_lens_cpu=[width] * padded, prefix_lens_cpu=host_prefix,
        max_seq_len=max(seq), max_extend_len=width)


def _columns(t: torch.Tensor, width: int) -> torch.Tensor:
    """The first `width` columns of t, zero-padded on the right where it has fewer."""
    if t.shape[1] >= width:
        return t[:, :width]
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))
