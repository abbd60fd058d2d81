"""Widening an EAGLE-3 head together with its target: the big head computes, on the widened
target's features, exactly the small head's function on the small target's features.

Data flow (bench models):  small head (trained by train-eagle3) + the widened target's
config.json (written by widen.py) -> widen_eagle3.py -> big head (public EAGLE-3 layout)
-> engine as `draft_model` next to the widened target: the big pair then has the small
pair's draft tokens and acceptance at a real head's cost.

Layout (h = small head hidden, H = big head hidden, ch = h the head's constant channel;
the widened target has real channels [0, d) and its constant a in channel c = d):

    fc [H, 3D]        rows [0, h) x columns {k*D + [0, d)} = the small fc; row ch reads
                      only the target's constant (block 0, channel c) with weight beta/a,
                      so fc writes exactly beta there; every other row tiny; every other
                      row reads the target's constant channels with weight 0
    q/k/v [., 2H]     inputs [0, h) and [H, H + h) are real; heads placed as in the target
                      (widen.head_placement); added rows random, real rows tiny elsewhere
    o/down [H, .]     real block + tiny; row ch = 0 (nothing writes the constant)
    norms             real weights * sqrt(h/H); the final norm scales ch by 1/beta
    lm_head [Vd, H]   real block + tiny; padded draft rows weigh ch by -M (never win)
    embed_tokens      shared with the target when the small head has none (then its
                      constant a sits in channel c = ch); an own table gets beta in ch

The constant beta: every RMSNorm of the head sees a vector whose real channels are the
small head's, plus beta in channel ch (the embedding carries it, fc writes it, no layer
writes it), plus tiny values. With one shared eps, beta^2 is cancelled in it:
    eps_big = (h * eps - beta^2) / H     (so sum(x^2) + beta^2 + H * eps_big = sum(x^2) + h * eps)
and every real normalized value is exact. A shared embedding forces beta = a (and needs
a^2 < h * eps); an own embedding takes beta^2 = h * eps / 2; a target without the
constant channel (vocab not padded) gives beta = 0 and no draft-vocab padding.

Usage: gearshift make-bench-model --shape llama-3.1-8b --out DIR --head HEAD --head-out DIR2
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gearshift.models.eagle3_loader import Eagle3Config
from gearshift.train.widen import PAD_LOGIT_WEIGHT, TINY_STD, head_placement

ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim")
M = "midlayer."


def _head_dims(cfg: dict) -> dict:
    heads = int(cfg["num_attention_heads"])
    return {
        "h": int(cfg["hidden_size"]), "hq": heads,
        "hkv": int(cfg.get("num_key_value_heads") or heads),
        "hd": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        "inter": int(cfg["intermediate_size"]),
    }


def _plan(small_cfg: dict, own_embed: bool, big_target_cfg: dict, shape: dict | None,
          draft_vocab_size: int | None) -> dict:
    info = big_target_cfg.get("gearshift_widened")
    if not info:
        raise ValueError("the big target config is not a widened one (no gearshift_widened)")
    ecfg = Eagle3Config.from_dict(small_cfg)
    src = info["from_shape"]
    d, D, a = int(src["d"]), int(big_target_cfg["hidden_size"]), float(info["constant"])
    s = _head_dims(small_cfg)
    b = _head_dims({**{k: big_target_cfg[k] for k in SHAPE_KEYS if k in big_target_cfg},
                    **(shape or {})})
    eps = ecfg.rms_norm_eps
    if ecfg.target_hidden_size != d or ecfg.vocab_size != int(src["vocab"]):
        raise ValueError(f"the head was made for a target of hidden {ecfg.target_hidden_size}, "
                         f"vocab {ecfg.vocab_size}; the widened target's source has {src}")
    if not own_embed and (s["h"] != d or b["h"] != D):
        raise ValueError("a head sharing the target's embedding must keep the target's width")
    if s["hd"] != b["hd"]:
        raise ValueError(f"head_dim differs: small {s['hd']}, shape {b['hd']}")
    if a == 0.0:
        beta = 0.0  # no constant in the features: fc cannot write one
    elif own_embed:
        beta = math.sqrt(s["h"] * eps / 2)
    else:
        beta = a
        if a * a >= s["h"] * eps:
            raise ValueError(f"the target's constant a^2={a * a:g} must stay below the head's "
                             f"h*eps={s['h'] * eps:g} (head eps too small for a shared embedding)")
    if beta > 0 and ecfg.norm_before_residual:
        raise ValueError("norm_before_residual heads cannot carry the constant channel")
    vd_s = ecfg.draft_vocab_size
    vd_b = int(draft_vocab_size or vd_s)
    bad = [k for k, ok in {
        "hidden_size": b["h"] >= s["h"] + int(beta > 0),
        "intermediate_size": b["inter"] >= s["inter"],
        "draft_vocab_size": vd_s <= vd_b <= int(big_target_cfg["vocab_size"]),
    }.items() if not ok]
    if bad:
        raise ValueError(f"head shape is smaller than the source head (or too big) in {bad}")
    if vd_b > vd_s and beta == 0.0:
        raise ValueError("padding the draft vocabulary needs the target's constant channel "
                         "(a widened target with a padded vocabulary)")
    q_slot, kv_src = head_placement(s["hq"], s["hkv"], b["hq"], b["hkv"])
    kv_pos = [j for j, k in enumerate(kv_src) if k >= 0]
    hd = s["hd"]
    rows = lambda heads: torch.cat([torch.arange(i * hd, (i + 1) * hd) for i in heads])
    return {
        "s": s, "b": b, "d": d, "D": D, "a": a, "beta": beta, "ch": s["h"], "eps": eps,
        "eps_big": (s["h"] * eps - beta * beta) / b["h"], "own_embed": own_embed,
        "vocab_b": int(big_target_cfg["vocab_size"]), "vd_s": vd_s, "vd_b": vd_b,
        "aux": ecfg.aux_layer_ids(int(src["layers"])),
        "q_rows": rows(q_slot), "kv_rows": rows(kv_pos),
        "kv_src_rows": rows([kv_src[j] for j in kv_pos]),
        "std": float(big_target_cfg.get("initializer_range", 0.02)),
    }


def _head_config(small_cfg: dict, plan: dict, big_target_cfg: dict) -> dict:
    s, b = plan["s"], plan["b"]
    cfg = {k: v for k, v in small_cfg.items()
           if k not in ("eagle_aux_hidden_state_layer_ids", "gearshift_widened")}
    eagle = dict(small_cfg.get("eagle_config") or {})
    eagle["eagle_aux_hidden_state_layer_ids"] = list(plan["aux"])  # explicit: the big
    cfg.update({  # target is deeper, its default ids would differ
        "hidden_size": b["h"], "intermediate_size": b["inter"],
        "num_attention_heads": b["hq"], "num_key_value_heads": b["hkv"], "head_dim": b["hd"],
        "rms_norm_eps": plan["eps_big"], "vocab_size": plan["vocab_b"],
        "draft_vocab_size": plan["vd_b"], "target_hidden_size": plan["D"],
        "max_position_embeddings": big_target_cfg.get(
            "max_position_embeddings", small_cfg.get("max_position_embeddings")),
        "eagle_config": eagle,
        "gearshift_widened": {
            "from_shape": {**s, "draft_vocab": plan["vd_s"]}, "constant": plan["beta"],
            "pad_logit_weight": PAD_LOGIT_WEIGHT, "tiny_std": TINY_STD,
        },
    })
    return cfg


def _shapes(plan: dict) -> dict[str, tuple[int, int] | tuple[int]]:
    b, h2 = plan["b"], 2 * plan["b"]["h"]
    q, kv, big_h, inter = b["hq"] * b["hd"], b["hkv"] * b["hd"], b["h"], b["inter"]
    shapes: dict = {
        "fc.weight": (big_h, 3 * plan["D"]), "norm.weight": (big_h,),
        "lm_head.weight": (plan["vd_b"], big_h),
        f"{M}self_attn.q_proj.weight": (q, h2), f"{M}self_attn.k_proj.weight": (kv, h2),
        f"{M}self_attn.v_proj.weight": (kv, h2), f"{M}self_attn.o_proj.weight": (big_h, q),
        f"{M}mlp.gate_proj.weight": (inter, big_h), f"{M}mlp.up_proj.weight": (inter, big_h),
        f"{M}mlp.down_proj.weight": (big_h, inter),
    }
    for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        shapes[f"{M}{n}.weight"] = (big_h,)
    if plan["own_embed"]:
        shapes["embed_tokens.weight"] = (plan["vocab_b"], big_h)
    return shapes


def _widen_one(name: str, shape: tuple, plan: dict, small: torch.Tensor, seed: int,
               dtype: torch.dtype, device) -> torch.Tensor:
    s, b, h, ch, beta = plan["s"], plan["b"], plan["s"]["h"], plan["ch"], plan["beta"]
    big_h, std = b["h"], plan["std"]
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    rand = lambda scale: torch.randn(shape, generator=gen, device=device,
                                     dtype=dtype).mul_(scale)
    small = small.to(device=device, dtype=dtype)
    ar = lambda n: torch.arange(n, device=device)
    leaf = name.split(".")[-2]

    if leaf.endswith("norm"):  # RMSNorm: see the module docstring for eps and beta
        w = torch.ones(shape, device=device, dtype=dtype)
        w[:h] = small * math.sqrt(h / big_h)
        if leaf == "norm" and beta > 0:
            w[ch] = 1.0 / beta  # padded lm_head rows read ch normalized to 1/rms
        return w
    if leaf == "fc":  # [H, 3D]: writes the residual stream, so every row is tiny
        w = rand(TINY_STD)
        d, D = plan["d"], plan["D"]
        cols = torch.cat([k * D + ar(d) for k in range(3)])
        w[:h, cols] = small
        if plan["a"] > 0:
            w[:, [k * D + d for k in range(3)]] = 0.0  # the target's constant a: ignored
        if beta > 0:
            w[ch] = 0.0
            w[ch, d] = beta / plan["a"]  # ... except by row ch, which writes exactly beta
        return w
    if leaf in ("embed_tokens", "lm_head"):
        w = rand(TINY_STD)  # [rows, H]
        w[: small.shape[0], :h] = small
        if beta > 0:
            if leaf == "embed_tokens":
                w[:, ch] = beta  # every row carries the constant, as the target's table
            else:
                w[:, ch] = 0.0
                w[plan["vd_s"]:, ch] = -PAD_LOGIT_WEIGHT
        return w
    if leaf in ("o_proj", "down_proj"):  # output projections [H, n_in]
        w = rand(TINY_STD)
        cols = plan["q_rows"] if leaf == "o_proj" else ar(s["inter"])
        w[:h, cols.to(device)] = small
        if beta > 0:
            w[ch] = 0.0  # nothing writes the constant channel
        return w
    # input projections [n_out, n_in]: added rows read everything, real rows real inputs
    w = rand(std)
    if leaf in ("q_proj", "k_proj", "v_proj"):
        rows, src_rows = {"q_proj": (plan["q_rows"], ar(s["hq"] * s["hd"]))}.get(
            leaf, (plan["kv_rows"], plan["kv_src_rows"]))
        cols, const = torch.cat([ar(h), big_h + ar(h)]), [ch, big_h + ch]
    else:  # gate_proj, up_proj
        rows = src_rows = ar(s["inter"])
        cols, const = ar(h), [ch]
    rows = rows.to(device)
    w[rows] *= TINY_STD / std
    w[rows[:, None], cols] = small[src_rows.to(device)]
    if beta > 0:
        w[rows[:, None], torch.tensor(const, device=device)] = 0.0
    return w


def widen_eagle3(
    small_cfg: dict, small_sd: dict[str, torch.Tensor], big_target_cfg: dict, *,
    shape: dict | None = None, draft_vocab_size: int | None = None, seed: int = 0,
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) of the big head, for the widened target `big_target_cfg`
    (widen.widen_config's output). `shape` overrides the head's hidden/intermediate/heads
    (default: the target's, as real heads have); `draft_vocab_size` pads the draft vocab."""
    sd = {k.removeprefix("model."): v for k, v in small_sd.items()}
    plan = _plan(small_cfg, "embed_tokens.weight" in sd, big_target_cfg, shape, draft_vocab_size)
    out = {name: _widen_one(name, shp, plan, sd[name], seed, dtype, device)
           for name, shp in _shapes(plan).items()}
    d2t = sd["d2t"].long() if "d2t" in sd else torch.zeros(plan["vd_s"], dtype=torch.int64)
    pad = torch.arange(plan["vd_s"], plan["vd_b"])
    out["d2t"] = torch.cat([d2t, -pad])  # padded draft ids map to target id 0 (never win)
    if "t2d" in sd:
        t2d = torch.zeros(plan["vocab_b"], dtype=torch.bool)
        t2d[torch.arange(plan["vd_s"]) + d2t] = True
        out["t2d"] = t2d
    return _head_config(small_cfg, plan, big_target_cfg), out


def make_bench_head(
    src: str | Path, big_target: str | Path, out: str | Path, *,
    draft_vocab_size: int | None = None, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
) -> Path:
    """Widen the head in `src` for the widened target in `big_target` (its config.json);
    write the public layout (config.json + model.safetensors) to `out`."""
    src, out = Path(src), Path(out)
    small_cfg = json.loads((src / "config.json").read_text())
    big_cfg = json.loads((Path(big_target) / "config.json").read_text())
    small_sd: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        small_sd.update(load_file(f))
    cfg, tensors = widen_eagle3(small_cfg, small_sd, big_cfg, draft_vocab_size=draft_vocab_size,
                                seed=seed, dtype=dtype, device=device)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.cpu().contiguous() for k, v in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
