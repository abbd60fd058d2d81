"""Every Triton kernel of the engine, each beside the plain-torch reference it must match
(tests/kernels runs them under TRITON_INTERPRET=1 on CPU):

    attention   decode.py (split-K decode), extend.py (prefill / mixed), tree.py (VERIFY)
    layers      norm.py, rope.py, activation.py, skinny_gemm.py + skinny_select.py (GEMMs of
                few rows and the start-up chooser against cuBLAS), pdl.py (programmatic
                dependent launch)
    sampling    sample.py (one fused pass: temperature, top-k / top-p, seeded draw)

Import the modules themselves: importing this package loads no kernel.
"""
