"""GPU tier: the skinny GEMM inside the model (bf16). With every few-row product forced
through the kernel (`on`) the decoder layers' outputs match cuBLAS's (`off`); `auto`
measures each shape once, outside CUDA-graph captures (the graph warm-up runs do it),
and reports its choices."""

from __future__ import annotations

import pytest
import torch

from gearshift import LLM, SamplingParams
from gearshift.models.kernels import skinny_select

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def chooser(monkeypatch):
    def use(mode: str) -> skinny_select.SkinnyChooser:
        c = skinny_select.SkinnyChooser(mode)
        monkeypatch.setattr(skinny_select, "CHOOSER", c)
        return c
    return use


def test_forced_kernel_matches_cublas_in_the_layers(tiny_llama_dir, chooser):
    from gearshift.models import ops

    llm = LLM(str(tiny_llama_dir), device="cuda", dtype="bfloat16", cuda_graphs=False)
    for layer in llm.engine.runner.model.layers:
        h = torch.randn(3, layer.mlp.gate_up_proj.in_features, device="cuda", dtype=torch.bfloat16)
        out = {}
        for mode in ("on", "off"):
            chooser(mode)
            out[mode] = (ops.linear(h, layer.self_attn.qkv_proj), layer.mlp(h))
        for got, want in zip(out["on"], out["off"], strict=True):
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_auto_measures_outside_captures(tiny_llama_dir, chooser):
    c = chooser("auto")
    llm = LLM(str(tiny_llama_dir), device="cuda", dtype="bfloat16", max_num_seqs=8,
              kv_cache_tokens=4096)
    outs = llm.generate([list(range(3, 3 + n)) for n in (5, 17, 9)],
                        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in outs)
    assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.graphs
    assert c.table, "decode shapes were measured during the graph warm-up"
    assert c.skipped_in_capture == 0
    for row in c.report():
        assert row["choice"] == "cublas" or row["choice"].startswith("skinny_")
        assert row["ms"]["cublas"] > 0 and len(row["ms"]) > 1
