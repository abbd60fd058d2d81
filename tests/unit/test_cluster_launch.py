"""What each replica is started with (no Ray needed): on a CPU the replicas share the
host's threads, a --step-trace file per replica, the bundles a replica's ranks ask for."""

from __future__ import annotations

from dataclasses import replace

from gearshift.cluster.launch import _bundles, _numbered, replica_config
from gearshift.llm import build_engine_config
from gearshift.runner.startup_checks import default_cpu_threads


def test_cpu_replicas_share_the_threads_and_keep_an_explicit_count():
    config = build_engine_config(None, device="cpu")
    assert replica_config(config, 2).cpu_threads == max(1, default_cpu_threads() // 2)
    assert replica_config(replace(config, cpu_threads=3), 2).cpu_threads == 3


def test_each_replica_traces_to_its_own_file(tmp_path):
    config = build_engine_config(None, device="cpu", step_trace=str(tmp_path / "t.jsonl"))
    assert _numbered(config, 1, 2).step_trace == str(tmp_path / "t.jsonl.replica1")
    assert _numbered(config, 0, 1).step_trace == str(tmp_path / "t.jsonl")
    assert _numbered(build_engine_config(None, device="cpu"), 1, 2).step_trace is None


def test_a_rank_asks_for_a_gpu_on_cuda_and_a_cpu_otherwise():
    config = build_engine_config(None, device="cpu", tensor_parallel_size=2)
    assert _bundles(config) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert _bundles(replace(config, device="cuda")) == [{"GPU": 1.0, "CPU": 1.0}] * 2
