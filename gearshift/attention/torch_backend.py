"""Reference attention in plain PyTorch over the slot pool (any device, eager only).

Data flow: called by Attention layers through AttentionBackend.rope_and_store (the
default: ops.rope, then store_kv) and .attend; the Triton backend is tested against it.
"""

from __future__ import annotations

import torch

from gearshift.attention.base import AttentionBackend
from gearshift.forward_batch import ForwardBatch


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            sm_scale: float) -> torch.Tensor:
    # q: [B, Hq, Lq, D]; k, v: [B, Hkv, Lk, D]; mask: [B, 1, Lq, Lk] bool (True = attend)
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    # GQA without copying K/V: q heads of one kv head share it through broadcasting
    qg = q.float().view(b, hkv, hq // hkv, lq, d)  # [B, Hkv, G, Lq, D]
    scores = torch.matmul(qg, k.float().transpose(-1, -2)[:, :, None]) * sm_scale
    scores = scores.masked_fill(~mask[:, :, None], float("-inf"))  # [B, Hkv, G, Lq, Lk]
    probs = torch.softmax(scores, dim=-1)
    # a masked key's weight is 0, but 0 * NaN is NaN: zero V of keys no query attends to
    # (slots past a request's length, slot 0 of padding tokens)
    v = v.float().masked_fill(~mask.any(dim=2)[..., None], 0.0)
    out = torch.matmul(probs, v[:, :, None])  # [B, Hkv, G, Lq, D]
    return out.view(b, hq, lq, d).to(q.dtype)


class TorchBackend(AttentionBackend):
    def decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        max_len = fb.max_seq_len
        slots = self.kv.req_to_token[fb.req_pool_indices, :max_len].long()  # [bs, L]
        k = self.kv.k[layer_id][slots].transpose(1, 2)  # [bs, Hkv, L, D]
        v = self.kv.v[layer_id][slots].transpose(1, 2)
        pos = torch.arange(max_len, device=q.device)
        mask = (pos[None, :] < fb.seq_lens[:, None])[:, None, None, :]  # [bs, 1, 1, L]
        out = _attend(q[:, :, None, :], k, v, mask, self.sm_scale)  # [bs, Hq, 1, D]
        return out[:, :, 0, :]

    def extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        out = torch.empty_like(q)
        rows = fb.req_pool_indices
        start = 0
        # every request of the layout, padding included (a padded EXTEND step's dummy
        # request holds the padding tokens: rows of `out` it skipped stayed uninitialised,
        # and their NaNs reached slot 0's K/V through the next layer)
        for i in range(len(fb.extend_lens_cpu)):
            n, total = fb.extend_lens_cpu[i], fb.seq_lens_cpu[i]
            if n == 0:
                continue
            prefix = total - n
            slots = self.kv.req_to_token[rows[i], :total].long()  # [total]
            k = self.kv.k[layer_id][slots].transpose(0, 1)[None]  # [1, Hkv, total, D]
            v = self.kv.v[layer_id][slots].transpose(0, 1)[None]
            qi = q[start:start + n].transpose(0, 1)[None]  # [1, Hq, n, D]
            q_pos = torch.arange(prefix, total, device=q.device)
            k_pos = torch.arange(total, device=q.device)
            mask = (k_pos[None, :] <= q_pos[:, None])[None, None]  # causal over the prefix
            out[start:start + n] = _attend(qi, k, v, mask, self.sm_scale)[0].transpose(0, 1)
            start += n
        return out
