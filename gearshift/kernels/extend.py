"""Extend (prefill chunk) attention over the slot pool: GQA-grouped causal flash attention.

Data flow: TritonBackend.extend -> extend_attention -> out. The backend has already
stored this step's K/V at out_cache_loc, so every key (cached prefix and new tokens) is
read through req_to_token[row, position] -> slot.

Queries are packed request after request (see forward_batch.py). Query i of request b
sits at absolute position prefix_b + i, prefix_b = seq_len_b - extend_len_b, and sees
keys 0..prefix_b + i of its own request.

One program = one tile: BLOCK_T query tokens of one request x the query heads of one KV
group (BLOCK_G of them), stacked on the M side of tl.dot, so each K/V block is read once
per group. Row r of the tile is token r // BLOCK_G, head r % BLOCK_G (G = 4, BLOCK_T = 2):

    row    0   1   2   3 | 4   5   6   7            keys 0 .. prefix-1 | prefix ..
    token  t0  t0  t0  t0| t1  t1  t1  t1      t0   x  x  x  x  x      | x
    head   h0  h1  h2  h3| h0  h1  h2  h3      t1   x  x  x  x  x      | x  x

Keys below the tile's first query position are seen by every row: they are read in whole
BLOCK_N blocks with no mask; only the last one or two blocks apply the causal mask.

Grid: (tiles, num_kv_heads * head_blocks). The tiles of all requests are numbered back
to back (request 0's tiles, then request 1's, ...; each request's last, longest tile
first); a program finds its request by a prefix sum over extend_lens, so a request with
one new token costs one tile, not cdiv(max_extend_len, BLOCK_T) programs that exit.

Compiled variants: the block config depends on (dtype, num_heads, num_kv_heads, head_dim,
GPU generation) and on one host-int class of the step, decode-heavy or not (num_tokens <=
DECODE_HEAVY_MEAN * bs: in an EXTEND graph, its padded shape). The batch size is not
specialised, so a model compiles at most two variants; `warmup_extend` compiles them at
start-up. Online softmax in the log2 domain, fp32 accumulators.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gearshift import env

_INTERPRET = env.triton_interpret()
_LOG2E = 1.4426950408889634


@triton.jit
def _find_tile(ExtendLens, bs, tile, BLOCK_T: tl.constexpr, SCAN: tl.constexpr):
    """(request, tiles of that request, index among them) of global tile `tile`.

    The request is -1 when `tile` lies past the last tile of the batch.
    """
    req = tl.zeros([], dtype=tl.int32) - 1
    req_tiles = tl.zeros([], dtype=tl.int32)
    local = tl.zeros([], dtype=tl.int32)
    base = tl.zeros([], dtype=tl.int32)  # tiles of the requests before this chunk
    for c0 in range(0, bs, SCAN):
        offs = c0 + tl.arange(0, SCAN)
        lens = tl.load(ExtendLens + offs, mask=offs < bs, other=0).to(tl.int32)
        n = (lens + BLOCK_T - 1) // BLOCK_T  # [SCAN] tiles per request
        end = base + tl.cumsum(n, 0)  # [SCAN] one past each request's last tile
        hit = (end - n <= tile) & (tile < end)  # at most one True in the whole batch
        req = tl.maximum(req, tl.max(tl.where(hit, offs, -1), 0))
        req_tiles += tl.sum(tl.where(hit, n, 0), 0)
        local += tl.sum(tl.where(hit, tile - (end - n), 0), 0)
        base += tl.sum(n, 0)
    return req, req_tiles, local


@triton.jit
def _attend_keys(
    acc, l_i, m_i, q, q_pos, K, V, ReqToToken, row, kv_head, start, end, sm_scale_log2,
    stride_ks, stride_kh, stride_vs, stride_vh, stride_rt,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Online-softmax update of the tile with keys start..end-1 of one request.

    CAUSAL=False: every row sees every key and end - start is a multiple of BLOCK_N.
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    even_d: tl.constexpr = HEAD_DIM == BLOCK_D
    slot_ptrs = ReqToToken + row * stride_rt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n  # [BLOCK_N] key positions
        if CAUSAL:
            mask_n = pos < end
            slots = tl.load(slot_ptrs + pos, mask=mask_n, other=0).to(tl.int64)
            kv_mask = mask_n[:, None] & mask_d[None, :]
        else:
            slots = tl.load(slot_ptrs + pos).to(tl.int64)
            kv_mask = mask_d[None, :]
        k_ptrs = K + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :]
        v_ptrs = V + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :]
        if CAUSAL or not even_d:
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        s = s * sm_scale_log2
        if CAUSAL:
            visible = (pos[None, :] <= q_pos[:, None]) & mask_n[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["bs"])
def _extend_kernel(
    Q, K, V, Out, ReqToToken, ReqPoolIdx, SeqLens, ExtendLens, ExtendStart,
    bs, sm_scale_log2,
    stride_qt, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_rt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, SCAN: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DECODE_ROWS: tl.constexpr, DEC_M: tl.constexpr, DEC_BLOCK_N: tl.constexpr,
):
    head_blocks: tl.constexpr = (GROUP + BLOCK_G - 1) // BLOCK_G
    kv_head = tl.program_id(1) // head_blocks
    g_start = (tl.program_id(1) % head_blocks) * BLOCK_G
    b, req_tiles, local = _find_tile(ExtendLens, bs, tl.program_id(0), BLOCK_T, SCAN)
    if b < 0:
        return
    m_start = (req_tiles - 1 - local) * BLOCK_T  # longest tile first
    extend_len = tl.load(ExtendLens + b)
    seq_len = tl.load(SeqLens + b)
    q_start = tl.load(ExtendStart + b).to(tl.int64)
    row = tl.load(ReqPoolIdx + b).to(tl.int64)
    # DECODE_ROWS: a 1-token request (a decoder riding along) is one tile of its group's
    # heads alone (DEC_M rows, the dot's minimum) over DEC_BLOCK_N-key blocks, not BLOCK_T
    # tokens x BLOCK_G heads with one token in it
    if DECODE_ROWS and extend_len == 1:
        _attend_tile(
            Q, K, V, Out, ReqToToken, row, kv_head, g_start, q_start, seq_len, extend_len, sm_scale_log2,
            stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot,
            stride_oh, stride_rt, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D, DOT_PRECISION,
            0, 1, DEC_BLOCK_N, DEC_M)
    else:
        _attend_tile(
            Q, K, V, Out, ReqToToken, row, kv_head, g_start, q_start, seq_len, extend_len, sm_scale_log2,
            stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot,
            stride_oh, stride_rt, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D, DOT_PRECISION,
            m_start, BLOCK_T, BLOCK_N, BLOCK_G)


@triton.jit
def _attend_tile(
    Q, K, V, Out, ReqToToken, row, kv_head, g_start, q_start, seq_len, extend_len,
    sm_scale_log2, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_rt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, m_start, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
    ROWS_G: tl.constexpr,
):
    """BLOCK_T tokens of one request from m_start x the BLOCK_G heads of one KV group from
    g_start, ROWS_G (>= BLOCK_G) tile rows a token: BLOCK_G, or the dot's 16 for a lone
    decoder token."""
    prefix = seq_len - extend_len
    offs_r = tl.arange(0, BLOCK_T * ROWS_G)
    offs_t = m_start + offs_r // ROWS_G  # [BLOCK_M] token of each row, within the request
    offs_g = g_start + offs_r % ROWS_G  # [BLOCK_M] head of each row, within the group
    offs_d = tl.arange(0, BLOCK_D)
    mask_r = (offs_t < extend_len) & (offs_g < GROUP) & (offs_g < g_start + BLOCK_G)
    mask_d = offs_d < HEAD_DIM
    tokens = q_start + offs_t  # [BLOCK_M] rows of q / out
    heads = kv_head * GROUP + offs_g  # [BLOCK_M]
    q = tl.load(Q + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_r[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    q_pos = prefix + offs_t  # [BLOCK_M] absolute positions

    m_i = tl.full([BLOCK_T * ROWS_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_T * ROWS_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_T * ROWS_G, BLOCK_D], dtype=tl.float32)
    # keys every row sees, in whole blocks; then the rest up to the tile's last query
    seen_by_all = (prefix + m_start) // BLOCK_N * BLOCK_N
    kv_end = tl.minimum(seq_len, prefix + m_start + BLOCK_T)
    acc, l_i, m_i = _attend_keys(
        acc, l_i, m_i, q, q_pos, K, V, ReqToToken, row, kv_head, 0, seen_by_all,
        sm_scale_log2, stride_ks, stride_kh, stride_vs, stride_vh, stride_rt,
        HEAD_DIM, BLOCK_N, BLOCK_D, False, DOT_PRECISION)
    acc, l_i, m_i = _attend_keys(
        acc, l_i, m_i, q, q_pos, K, V, ReqToToken, row, kv_head, seen_by_all, kv_end,
        sm_scale_log2, stride_ks, stride_kh, stride_vs, stride_vh, stride_rt,
        HEAD_DIM, BLOCK_N, BLOCK_D, True, DOT_PRECISION)

    # every row (even a masked one) saw key seen_by_all <= its position, so l_i > 0
    out = acc / l_i[:, None]
    tl.store(Out + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=mask_r[:, None] & mask_d[None, :])


@dataclass(frozen=True)
class ExtendConfig:
    block_t: int  # query tokens per tile
    block_g: int  # query heads per tile (of one KV group); M = block_t * block_g rows
    block_n: int  # keys per inner-loop block
    num_warps: int
    num_stages: int
    scan: int  # extend_lens read per step of the tile search
    decode_rows: bool = True  # 1-token requests take the decoder path (DEC_M x dec_block_n)
    dec_block_n: int = 64  # keys per inner-loop block on the decoder path


# Mean new tokens per request at or below which a step counts as decode-heavy (decoders
# riding along with a short prefill chunk): 60 decoders and a 196-token chunk, 4.2 tokens
# a request, measured decode-heavy.
DECODE_HEAVY_MEAN = 4


def is_decode_heavy(num_tokens: int, bs: int) -> bool:
    """The step class the config depends on, from host ints only (graph-safe)."""
    return num_tokens <= DECODE_HEAVY_MEAN * bs


@functools.cache
def extend_config(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
                  capability: int = 9, decode_heavy: bool = False) -> ExtendConfig:
    """Block config from the model's shape, the GPU's major compute capability and the
    step class (`is_decode_heavy`), never from the batch itself.

    Every config sends 1-token requests (decoders riding along) down the decoder path:
    one tile of the group's heads (16 rows, the dot's minimum) over `dec_block_n`-key
    blocks, where a token tile would carry them in BLOCK_T x BLOCK_G rows, most of them
    empty (benchmarks/bench_extend_attn.py: mixed steps of 60 decoders and a prefill chunk
    ran clearly faster with it, decode-heavy or not).

    GPU, 16-bit, head_dim <= 128: M = 64 rows (G = 4: 16 tokens x 4 heads), BLOCK_N = 64.
    On Hopper that is one warpgroup (4 warps, wgmma m64), 2 stages (faster than 3 on fresh
    prompts); decoders over 128-key blocks. Before Hopper 4 warps spill at this tile: 8
    warps, 3 stages.

    Decode-heavy steps on Hopper: M = 32 (8 tokens x 4 heads), BLOCK_N = 64, 2 stages: the
    short chunk's tiles waste fewer rows. On fresh prompts the 32-row tile fell far behind,
    hence the two classes.
    """
    group = num_heads // num_kv_heads
    if _INTERPRET:
        rows, block_n, num_warps, num_stages, scan = 16, 32, 1, 1, 32
    elif dtype == torch.float32:
        rows, block_n, num_warps, num_stages, scan = 32, 32, 4, 2, 128
    elif head_dim > 128:
        rows, block_n, num_warps, num_stages, scan = 64, 32, 8, 2, 128
    elif decode_heavy and capability >= 9 and group == 4:
        rows, block_n, num_warps, num_stages, scan = 32, 64, 4, 2, 128
    else:
        rows, block_n, scan = 64, 64, 128
        hopper = capability >= 9
        num_warps = 4 if hopper or head_dim <= 64 else 8
        num_stages = 2 if hopper else 3
    dec_block_n = 128 if not _INTERPRET and dtype != torch.float32 and head_dim <= 128 else block_n
    block_g = min(triton.next_power_of_2(group), rows)
    return ExtendConfig(rows // block_g, block_g, block_n, num_warps, num_stages, scan,
                        True, dec_block_n)


@functools.cache
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def _capability_of(t: torch.Tensor) -> int:
    """The major compute capability of t's GPU (9, Hopper's, off CUDA: configs for tests)."""
    return _capability(t.device.index or 0) if t.is_cuda else 9


def num_tiles_bound(cfg: ExtendConfig, bs: int, num_tokens: int, max_extend_len: int) -> int:
    """Upper bound on sum(cdiv(extend_len_b, block_t)) from host ints (the grid's x)."""
    per_request = bs * triton.cdiv(max_extend_len, cfg.block_t)
    packed = (num_tokens + bs * (cfg.block_t - 1)) // cfg.block_t
    return min(per_request, packed)


def extend_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [max_num_seqs + 1, max_model_len] int32
    req_pool_indices: torch.Tensor,  # [bs] int: row of req_to_token per request
    seq_lens: torch.Tensor,  # [bs] int: prefix + extend
    extend_lens: torch.Tensor,  # [bs] int: new tokens of each request
    extend_start_loc: torch.Tensor,  # [bs] int: first row of each request in q
    sm_scale: float,
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim], written in place
    *,
    max_extend_len: int,  # host int: max(extend_lens), bounds the grid
    config: ExtendConfig | None = None,  # None: extend_config(...) (an override is for tuning)
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its prefix and themselves."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    bs = req_pool_indices.shape[0]
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    assert out.stride(2) == 1 and req_to_token.stride(1) == 1
    if bs == 0 or num_tokens == 0 or max_extend_len <= 0:
        return out

    group = num_heads // num_kv_heads
    capability = _capability_of(q)
    cfg = config or extend_config(q.dtype, num_heads, num_kv_heads, head_dim, capability,
                                  is_decode_heavy(num_tokens, bs))
    # per-request scalars are read at unit stride: materialise expanded views
    req_pool_indices, seq_lens, extend_lens, extend_start_loc = (
        t.contiguous() for t in (req_pool_indices, seq_lens, extend_lens, extend_start_loc))
    grid = (num_tiles_bound(cfg, bs, num_tokens, max_extend_len),
            num_kv_heads * triton.cdiv(group, cfg.block_g))
    _extend_kernel[grid](
        q, k_cache, v_cache, out, req_to_token, req_pool_indices, seq_lens, extend_lens,
        extend_start_loc,
        bs, sm_scale * _LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1),
        req_to_token.stride(0),
        GROUP=group, HEAD_DIM=head_dim,
        BLOCK_T=cfg.block_t, BLOCK_G=cfg.block_g, BLOCK_N=cfg.block_n,
        BLOCK_D=triton.next_power_of_2(head_dim), SCAN=cfg.scan,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32: exact, no TF32
        DECODE_ROWS=cfg.decode_rows, DEC_M=max(16, triton.next_power_of_2(cfg.block_g)),
        DEC_BLOCK_N=cfg.dec_block_n,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def warmup_extend(k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                  num_heads: int) -> None:
    """Compile the model's extend variants (one per step class) before serving (Triton
    compiles lazily).

    k_cache, v_cache: one layer's [num_slots + 1, num_kv_heads, head_dim] (every layer
    shares the variants). Runs a 1-token request on the dummy row 0 / slot 0 under each
    class's config, with the index dtypes of ForwardBatch (req_pool_indices int64, the
    others int32). Query strides are only specialised by divisibility by 16, so a
    packed-qkv view of q reuses the variant compiled for a contiguous q whenever head_dim
    is a multiple of 16.
    """
    device = k_cache.device
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    capability = _capability_of(k_cache)
    q = torch.zeros(1, num_heads, head_dim, dtype=k_cache.dtype, device=device)
    one = torch.ones(1, dtype=torch.int32, device=device)
    configs = dict.fromkeys(extend_config(k_cache.dtype, num_heads, num_kv_heads, head_dim,
                                          capability, heavy) for heavy in (False, True))
    for cfg in configs:
        extend_attention(q, k_cache, v_cache, req_to_token,
                         torch.zeros(1, dtype=torch.int64, device=device), one, one,
                         torch.zeros(1, dtype=torch.int32, device=device), 1.0,
                         torch.empty_like(q), max_extend_len=1, config=cfg)
