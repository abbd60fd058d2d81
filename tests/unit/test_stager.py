"""Stager: host lists to the device in one copy (int64, int32 and float32 parts side by
side), each part starting 16 bytes after the copy's start times an integer (Triton
specialises kernels on 16-byte pointer alignment: parts at length-dependent offsets
would recompile kernels mid-run)."""

from __future__ import annotations

import random

import torch

from gearshift.runner.staging import ALIGN_BYTES, Stager, to_device


def test_parts_keep_their_values_and_start_aligned():
    rng = random.Random(0)
    kinds = ((torch.int64, "add_ints"), (torch.int32, "add_int32"), (torch.float32, "add_floats"))
    for _ in range(50):
        st = Stager(torch.device("cpu"))
        parts = {}
        for j in range(rng.randrange(1, 8)):
            dtype, add = rng.choice(kinds)
            n = rng.randrange(0, 9)
            v = [rng.random() for _ in range(n)] if dtype.is_floating_point \
                else [rng.randrange(-2**31, 2**31) for _ in range(n)]
            parts[f"p{j}"] = (dtype, v)
            getattr(st, add)(f"p{j}", v)
        out = st.to_device()
        first = out["p0"].data_ptr()
        storages = {out[name].untyped_storage().data_ptr() for name in parts}
        assert len(storages) == 1  # one buffer: one host-to-device copy
        for name, (dtype, v) in parts.items():
            t = out[name]
            assert t.dtype == dtype and t.shape == (len(v),)
            assert t.tolist() == torch.tensor(v, dtype=dtype).tolist()
            assert (t.data_ptr() - first) % ALIGN_BYTES == 0


def test_a_small_list_reaches_the_device_with_its_shape_and_dtype():
    rows = [[1, 2, 3], [4, 5, 6]]
    t = to_device(rows, torch.long, torch.device("cpu"))
    assert t.dtype == torch.long and t.tolist() == rows
    assert to_device([True, False], torch.bool, torch.device("cpu")).tolist() == [True, False]
