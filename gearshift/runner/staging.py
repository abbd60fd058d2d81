"""Host lists to device tensors: `Stager` (one host-to-device copy per step; a VERIFY step
makes a second for its target pass while the draft runs), `to_device` (a small list a
proposer or the draft makes mid-step, pinned likewise), the
padding rule's host side (`pad_batch`: a plan's `Layout`, runner/layout.py) and the
extend-layout lists every forward batch is built from (`stage_forward`, `forward_batch`).

    EXTEND padded to (`rows`, `tokens`): the real requests (T tokens), then ONE dummy
    request holding the tokens - T padding tokens, then empty requests up to `rows`:

        request      r0   r1   r2  | dummy       | empty  empty ...
        row          5    2    7   | 0           | 0      0
        prefix       4    9    0   | 0           | 0      0
        extend       3    1    2   | tokens - T  | 0      0
        start        0    3    4   | T           | tokens tokens
        logits idx   2    3    5   | 0           | 0      0
        tokens       real (T)      | id 0, slot 0, positions 0 .. tokens - T - 1

    The dummy's keys are req_to_token[0, :tokens - T] = slot 0, so the extend kernel
    reads row 0 only (runner buckets never exceed the table's columns); empty requests
    own no tile. The kernel's grid then depends on (tokens, rows) alone. DECODE padded to
    `rows` (== tokens): every padding row is a 1-token dummy request. Padding uses the
    reserved dummy row 0 and dummy slot 0 (kv_pool.py), so it never reads or writes a
    real request's KV.

Data flow: BatchBuilder.prepare (runner/batch.py), the draft's batches
(speculative/draft_follow.py) -> Stager.to_device -> forward_batch -> ForwardBatch.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import torch

from gearshift.attention.base import KVCache
from gearshift.forward_batch import ForwardBatch, ForwardMode

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


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list (nested: its shape) on `device` without the host waiting: copied
    from pinned memory on CUDA, where a copy from pageable memory may first wait for the
    stream's queued work (the step's later launches would then start on an idle device)."""
    pin = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pin).to(device, non_blocking=True)


def pad_batch(mode: ForwardMode, rows: list[int], prefix: list[int], extend: list[int],
              input_ids: list[int], out_loc: list[int], padding):
    """Host lists of a batch with the dummy requests and tokens of `padding` (a Layout:
    its `rows` and `tokens`; see the module doc) appended. -> (rows, prefix, extend,
    input_ids, out_loc); unchanged without padding (None, or a layout of the real size)."""
    if padding is None or (padding.rows == len(rows) and padding.tokens == sum(extend)):
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
