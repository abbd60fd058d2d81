"""Stager: host lists to the device in one copy per dtype, each part starting 16 bytes
after the copy's start times an integer (Triton specialises kernels on 16-byte pointer
alignment: parts at length-dependent offsets recompiled kernels mid-run on the H200)."""

from __future__ import annotations

import random

import torch

from gearshift.scheduler.batch import ALIGN_BYTES, Stager


def test_parts_keep_their_values_and_start_aligned():
    rng = random.Random(0)
    for _ in range(50):
        st = Stager(torch.device("cpu"))
        ints = {f"i{j}": [rng.randrange(-9, 9) for _ in range(rng.randrange(0, 9))]
                for j in range(rng.randrange(1, 6))}
        floats = {f"f{j}": [rng.random() for _ in range(rng.randrange(0, 9))]
                  for j in range(rng.randrange(0, 4))}
        for name, v in ints.items():
            st.add_ints(name, v)
        for name, v in floats.items():
            st.add_floats(name, v)
        out = st.to_device()
        for group, dtype in ((ints, torch.int64), (floats, torch.float32)):
            if not group:
                continue
            first = out[next(iter(group))].data_ptr()
            for name, v in group.items():
                t = out[name]
                assert t.dtype == dtype and t.shape == (len(v),)
                assert t.tolist() == (v if dtype == torch.int64 else torch.tensor(v).tolist())
                assert (t.data_ptr() - first) % ALIGN_BYTES == 0
