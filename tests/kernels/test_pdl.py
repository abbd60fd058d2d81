"""Programmatic dependent launch (models/kernels/pdl.py): off on CPU / under the interpreter
(the kernels' PDL constexpr is False there and no launch flag is passed); on an sm90+ GPU
the decode-path kernels give bit-identical results with it on and off, eagerly and
replayed in a CUDA graph (each kernel waits for its predecessor before any load)."""

from __future__ import annotations

import pytest
import torch

from gearshift.models.kernels import pdl

HAS_CUDA = torch.cuda.is_available()


def test_off_on_cpu():
    assert pdl.enabled("cpu") is False
    assert pdl.launch_options(torch.device("cpu")) == {"PDL": False}


def _chain(x, residual, norm_w, w_gate_up, w_down):
    """A decode layer's MLP half through the PDL kernels: add + RMSNorm, the gated skinny
    GEMM, the plain skinny GEMM, then a plain RMSNorm."""
    from gearshift.models.kernels.norm import fused_add_rms_norm, rms_norm
    from gearshift.models.kernels.skinny_gemm import SkinnyConfig, skinny_linear

    h, residual = fused_add_rms_norm(x, residual, norm_w, 1e-6)
    act = skinny_linear(h, w_gate_up, config=SkinnyConfig(16, 32, 128, 4, 4), gated=True)
    out = skinny_linear(act, w_down, config=SkinnyConfig(16, 32, 128, 4, 4))
    return rms_norm(out, norm_w, 1e-6), residual


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_results_identical_with_and_without_pdl(monkeypatch):
    g = torch.Generator(device="cuda").manual_seed(0)
    args = [torch.randn(*s, device="cuda", generator=g, dtype=torch.bfloat16) / d
            for s, d in (((8, 256), 1), ((8, 256), 1), ((256,), 1), ((2 * 512, 256), 16), ((256, 512), 22))]
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("GEARSHIFT_PDL", flag)
        pdl.enabled.cache_clear()
        x, residual = args[0].clone(), args[1].clone()
        eager = _chain(x, residual, *args[2:])
        x, residual = args[0].clone(), args[1].clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _chain(x, residual, *args[2:])
        x.copy_(args[0])
        residual.copy_(args[1])
        graph.replay()
        torch.cuda.synchronize()
        results[flag] = (eager, captured)
    pdl.enabled.cache_clear()
    sm90 = torch.cuda.get_device_capability()[0] >= 9
    monkeypatch.setenv("GEARSHIFT_PDL", "1")
    assert pdl.enabled("cuda") is (sm90 and pdl._triton_supports_pdl())
    pdl.enabled.cache_clear()
    for a, b in zip([*results["0"][0], *results["0"][1]], [*results["1"][0], *results["1"][1]], strict=True):
        assert torch.equal(a, b)
