"""Widening: embed a small trained Llama into a bigger Llama shape with the same function.

Data flow (bench models):  small checkpoint (trained by tiny_lm.py) + shape preset
-> widen.py -> big checkpoint (sharded safetensors) or an in-memory state dict
-> engine / benchmarks, which then pay the big model's cost for the small one's tokens.

Layout (d = small hidden, D = big hidden, c = d is the spare "constant" channel):

    hidden channels   [0, d) real  | c: constant a | (c, D) added: tiny values
    q heads           real heads at the head slots of the kv groups that hold a copy of
                      their small kv head (big q head h uses kv head h // (Hq/Hkv))
    MLP channels      [0, I_small) real | the rest added
    layers            [0, L_small) real | the rest appended (see the real residual stream)
    vocab             [0, V_small) real | padded rows: logit = -M * (positive) << real ones

Rules: real parts keep their weights on real inputs and tiny ones elsewhere; added parts
get random input weights (std = initializer_range) and tiny random output weights
(std `tiny`), so they cost full price and add ~nothing; nothing ever writes channel c.
RMSNorm: a vector living in d of D channels has a smaller RMS, so real norm weights are
multiplied by sqrt(d/D); the constant's square a^2 is cancelled in the eps:
    eps_big = (d * eps - a^2) / D,  a^2 = d * eps / 2
which makes every real normalized value exact. The final norm scales channel c by 1/a
and padded lm_head rows weigh it by -M. The EAGLE-3 head is widened elsewhere (later).

Usage: gearshift make-bench-model --shape llama-3.1-8b --out DIR [--src DIR]
"""

from __future__ import annotations

import json
import math
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")
COPY_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json")
PAD_LOGIT_WEIGHT = 1.0e5  # M: padded rows' weight on the constant channel (negative)
TINY_STD = 1.0e-7  # std of "tiny" weights: nonzero, but adds ~nothing to real channels


def _dims(cfg: dict) -> dict:
    heads = int(cfg["num_attention_heads"])
    return {
        "d": int(cfg["hidden_size"]),
        "hq": heads,
        "hkv": int(cfg.get("num_key_value_heads") or heads),
        "hd": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        "inter": int(cfg["intermediate_size"]),
        "layers": int(cfg["num_hidden_layers"]),
        "vocab": int(cfg["vocab_size"]),
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "eps": float(cfg.get("rms_norm_eps", 1e-6)),
    }


def head_placement(hq_s: int, hkv_s: int, hq_b: int, hkv_b: int) -> tuple[list[int], list[int]]:
    """Where the small model's heads go in the big one.

    Returns (q_slot, kv_src): small q head h lands at big q head q_slot[h]; big kv head j
    is a copy of small kv head kv_src[j] (or -1: an added head). Each small kv group fills
    as many big groups as it needs, so q_slot[h] // (hq_b // hkv_b) always holds a copy of
    small kv head h // (hq_s // hkv_s).
    """
    g_s, g_b = hq_s // hkv_s, hq_b // hkv_b
    q_slot, kv_src, group = [], [-1] * hkv_b, 0
    for k in range(hkv_s):
        members = list(range(k * g_s, (k + 1) * g_s))
        while members:
            if group >= hkv_b:
                raise ValueError(f"cannot place {hq_s}q/{hkv_s}kv heads into {hq_b}q/{hkv_b}kv")
            take, members = members[:g_b], members[g_b:]
            kv_src[group] = k
            q_slot += [group * g_b + i for i in range(len(take))]
            group += 1
    return q_slot, kv_src


def widen_config(small_cfg: dict, big_cfg: dict) -> dict:
    """The big shape's config.json with the small model's RoPE, token ids and the new eps."""
    s, b = _dims(small_cfg), _dims(big_cfg)
    if s["hd"] != b["hd"]:
        raise ValueError(f"head_dim differs: small {s['hd']}, shape {b['hd']}")
    pad = b["vocab"] > s["vocab"]
    checks = {
        "hidden_size": b["d"] >= s["d"] + int(pad),
        "intermediate_size": b["inter"] >= s["inter"],
        "num_hidden_layers": b["layers"] >= s["layers"],
        "vocab_size": b["vocab"] >= s["vocab"],
    }
    if b["tied"] and not s["tied"]:
        checks["tie_word_embeddings"] = False  # an untied lm_head cannot become tied
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise ValueError(f"shape is smaller than the source model in {bad}")
    head_placement(s["hq"], s["hkv"], b["hq"], b["hkv"])  # raises when impossible
    a2 = s["d"] * s["eps"] / 2 if pad else 0.0
    cfg = {k: v for k, v in big_cfg.items() if k not in ROPE_KEYS}
    cfg.update({k: small_cfg[k] for k in ROPE_KEYS if k in small_cfg})
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in small_cfg:
            cfg[key] = small_cfg[key]
    # Always a plain Llama: a Qwen shape becomes a Llama of its dimensions (no qkv bias,
    # no qk-norm), which costs within a hair of the original.
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["model_type"] = "llama"
    cfg["attention_bias"] = cfg["mlp_bias"] = False
    cfg["head_dim"] = b["hd"]
    cfg["rms_norm_eps"] = (s["d"] * s["eps"] - a2) / b["d"]
    cfg["gearshift_widened"] = {
        "from_shape": {k: s[k] for k in ("d", "hq", "hkv", "hd", "inter", "layers", "vocab")},
        "constant": math.sqrt(a2),
        "pad_logit_weight": PAD_LOGIT_WEIGHT,
        "tiny_std": TINY_STD,
    }
    return cfg


def _plan(small_cfg: dict, big_cfg: dict) -> dict:
    s, b = _dims(small_cfg), _dims(big_cfg)
    q_slot, kv_src = head_placement(s["hq"], s["hkv"], b["hq"], b["hkv"])
    kv_pos = [j for j, k in enumerate(kv_src) if k >= 0]
    hd = s["hd"]
    head_rows = lambda heads: torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in heads])
    return {
        "s": s, "b": b,
        "q_rows": head_rows(q_slot),  # big q_proj rows of small q heads 0..hq_s-1
        "kv_rows": head_rows(kv_pos),  # big k/v rows of the copied kv heads
        "kv_src_rows": head_rows([kv_src[j] for j in kv_pos]),  # matching small rows
        "const": math.sqrt(s["d"] * s["eps"] / 2) if b["vocab"] > s["vocab"] else 0.0,
        "std": float(big_cfg.get("initializer_range", 0.02)),
    }


def _tensor_names(b: dict) -> list[str]:
    names = ["model.embed_tokens.weight"]
    for i in range(b["layers"]):
        p = f"model.layers.{i}."
        names += [p + n + ".weight" for n in (
            "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
            "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
            "mlp.down_proj")]
    names.append("model.norm.weight")
    if not b["tied"]:
        names.append("lm_head.weight")
    return names


def _shape(name: str, b: dict) -> tuple[int, ...]:
    q, kv = b["hq"] * b["hd"], b["hkv"] * b["hd"]
    leaf = name.split(".")[-2]
    return {
        "embed_tokens": (b["vocab"], b["d"]), "lm_head": (b["vocab"], b["d"]),
        "q_proj": (q, b["d"]), "k_proj": (kv, b["d"]), "v_proj": (kv, b["d"]),
        "o_proj": (b["d"], q), "gate_proj": (b["inter"], b["d"]),
        "up_proj": (b["inter"], b["d"]), "down_proj": (b["d"], b["inter"]),
    }.get(leaf, (b["d"],))


def _widen_one(name: str, plan: dict, small_sd: dict, seed: int, dtype, device) -> torch.Tensor:
    s, b, std = plan["s"], plan["b"], plan["std"]
    d, c = s["d"], s["d"]  # real channels [0, d); the constant channel c = d
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    rand = lambda scale: torch.randn(_shape(name, b), generator=gen, device=device,
                                     dtype=dtype).mul_(scale)
    small = lambda key: small_sd[key].to(device=device, dtype=dtype)
    leaf = name.split(".")[-2]
    layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
    real = layer < s["layers"]  # embeddings, final norm, lm_head are real too
    src = name if leaf != "lm_head" or not s["tied"] else "model.embed_tokens.weight"
    has_const = plan["const"] > 0

    if leaf.endswith("norm"):
        w = torch.ones(b["d"], device=device, dtype=dtype)
        if real:
            w[:d] = small(src) * math.sqrt(d / b["d"])
            if leaf == "norm" and has_const:
                w[c] = 1.0 / plan["const"]
        return w
    if leaf in ("embed_tokens", "lm_head"):
        w = rand(TINY_STD)  # [vocab_big, D]
        w[: s["vocab"], :d] = small(src)
        if has_const:
            # Inputs carry the constant; as an output layer (lm_head, or a tied embedding)
            # padded rows weigh it by -M. A tied embedding's real rows keep a there: that
            # shifts every real logit of a position by the same amount (softmax-invariant).
            w[: s["vocab"], c] = plan["const"] if leaf == "embed_tokens" else 0.0
            if leaf == "lm_head" or b["tied"]:
                w[s["vocab"] :, c] = -PAD_LOGIT_WEIGHT
            else:
                w[s["vocab"] :, c] = plan["const"]
        return w
    if leaf in ("o_proj", "down_proj"):  # output projections: [D, n_in]
        w = rand(TINY_STD)
        if real:
            cols = plan["q_rows"] if leaf == "o_proj" else torch.arange(s["inter"])
            w[:d, cols.to(device)] = small(src)
        if has_const:
            w[c] = 0.0  # nothing writes the constant channel
        return w
    w = rand(std)  # input projections: [n_out, D]; added parts read everything
    if real:
        if leaf == "q_proj":
            rows, src_rows = plan["q_rows"], torch.arange(s["hq"] * s["hd"])
        elif leaf in ("k_proj", "v_proj"):
            rows, src_rows = plan["kv_rows"], plan["kv_src_rows"]
        else:  # gate_proj, up_proj
            rows = src_rows = torch.arange(s["inter"])
        rows = rows.to(device)
        w[rows] *= TINY_STD / std
        w[rows, :d] = small(src)[src_rows.to(device)]
    return w


def iter_widened(
    small_cfg: dict, small_sd: dict, big_cfg: dict, seed: int = 0,
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the widened checkpoint, one at a time (HF Llama names)."""
    plan = _plan(small_cfg, widen_config(small_cfg, big_cfg))
    for name in _tensor_names(plan["b"]):
        yield name, _widen_one(name, plan, small_sd, seed, dtype, device)


def widen_state_dict(
    small_cfg: dict, small_sd: dict, big_cfg: dict, seed: int = 0,
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """The whole widened state dict in memory; pair it with widen_config(small, big)."""
    return dict(iter_widened(small_cfg, small_sd, big_cfg, seed, dtype, device))


def load_shape(shape: str) -> dict:
    """A shape preset by name (gearshift/presets/NAME.json) or a path to a config.json."""
    path = Path(shape)
    if not path.is_file():
        path = PRESETS_DIR / f"{shape}.json"
    if not path.is_file():
        names = sorted(p.stem for p in PRESETS_DIR.glob("*.json"))
        raise FileNotFoundError(f"no shape {shape!r}: not a file, nor a preset in {names}")
    return json.loads(path.read_text())


def load_small(src: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    src = Path(src)
    cfg = json.loads((src / "config.json").read_text())
    sd: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        sd.update(load_file(f))
    return cfg, sd


def make_bench_model(
    src: str | Path, shape: str, out: str | Path, seed: int = 0,
    dtype: torch.dtype = torch.bfloat16, device: str = "cpu", shard_gb: float = 4.0,
) -> Path:
    """Write the widened checkpoint (sharded safetensors + index when large) to `out`."""
    small_cfg, small_sd = load_small(src)
    big_cfg = widen_config(small_cfg, load_shape(shape))
    big_cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    plan = _plan(small_cfg, big_cfg)
    names = _tensor_names(plan["b"])
    nbytes = {n: math.prod(_shape(n, plan["b"])) * dtype.itemsize for n in names}
    shards: list[list[str]] = [[]]
    for n in names:
        if shards[-1] and sum(nbytes[m] for m in shards[-1]) + nbytes[n] > shard_gb * 2**30:
            shards.append([])
        shards[-1].append(n)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i, group in enumerate(shards):
        fname = ("model.safetensors" if len(shards) == 1
                 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
        tensors = {n: _widen_one(n, plan, small_sd, seed, dtype, device).cpu() for n in group}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, fname))
        print(f"wrote {fname} ({sum(nbytes[n] for n in group) / 2**30:.2f} GiB)", flush=True)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(nbytes.values())}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(big_cfg, indent=2) + "\n")
    for f in COPY_FILES:
        if (Path(src) / f).is_file():
            shutil.copy(Path(src) / f, out / f)
    return out
