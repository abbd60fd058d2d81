"""What a bench ran on, saved beside its figures: device, date, torch, the engine's flags,
the model's shape and the draft (if any), so a JSON says what it measured.

Data flow: LLM -> environment(llm) -> the "env" block of every bench JSON -> benchmarks/report.py.
"""

from __future__ import annotations

import platform
from datetime import UTC, datetime


def environment(llm) -> dict:
    import torch

    cfg = llm.engine.config
    mc = llm.engine.model_config
    dev = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else platform.processor()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": dev or cfg.device, "torch": torch.__version__, "model": cfg.model,
        "load_format": cfg.load_format, "dtype": cfg.dtype,
        "attention_backend": cfg.attention_backend, "cuda_graphs": cfg.use_cuda_graphs,
        "overlap_schedule": cfg.overlap_schedule,
        "norms_in_gemms": llm.engine.runner.model.norms_folded,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "kv_slots": llm.engine.memory_stats()["kv_slots_total"],
        "model_shape": {"layers": mc.num_layers, "hidden": mc.hidden_size, "heads": mc.num_heads,
                        "kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim,
                        "intermediate": mc.intermediate_size, "vocab": mc.vocab_size},
        "draft": ({"algorithm": cfg.speculative_algorithm, "model": cfg.draft_model,
                   "num_draft_tokens": cfg.num_draft_tokens, "tree_width": cfg.tree_width,
                   "tree_budget": cfg.verify_nodes if cfg.tree_width > 1 else None,
                   "spec_policy": cfg.spec_policy, "spec_sampling": cfg.spec_sampling}
                  if llm.engine.spec is not None else None),
    }
