"""triton_compiles(): the names of kernels Triton compiles inside the block, through
Triton's post-compile hook (restored afterwards, chaining to one already installed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gearshift.runner.jit_log import triton_compiles

knobs = pytest.importorskip("triton.knobs")


def test_records_compiles_inside_the_block_and_restores_the_hook():
    earlier = []
    knobs.runtime.jit_post_compile_hook = lambda **kw: earlier.append(kw["fn"].name)
    try:
        with triton_compiles() as log:
            assert log.available
            knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="extend_kernel"), key=1)
            knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="decode_kernel"), key=2)
        assert log == ["extend_kernel", "decode_kernel"]
        assert earlier == ["extend_kernel", "decode_kernel"]  # the earlier hook still ran
        knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="after"))
        assert log == ["extend_kernel", "decode_kernel"] and earlier[-1] == "after"
    finally:
        knobs.runtime.jit_post_compile_hook = None
