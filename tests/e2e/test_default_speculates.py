"""The README's first command speculates: `gearshift serve` with no model and no
speculation flag loads the embedded model's EAGLE-3 head and runs goodput, so greedy code
requests show VERIFY steps and accepted drafts on /metrics; --no-speculation turns it off."""

from __future__ import annotations

import re

import httpx
from served_process import serve_process

CODE = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):",
        "for i in range(10):\n    "]


def _stat(metrics: str, name: str) -> float:
    m = re.search(r'^gearshift_engine_stat\{name="' + re.escape(name) + r'"\} (\S+)$', metrics,
                  re.M)
    return float(m.group(1)) if m else 0.0


def _serve_code(base: str) -> str:
    with httpx.Client(base_url=base, timeout=120) as client:
        for i in range(16):
            r = client.post("/v1/completions", json={"prompt": CODE[i % 4] + " " * (i // 4),
                                                      "max_tokens": 24, "temperature": 0})
            assert r.status_code == 200, r.text
        return client.get("/metrics").text


def test_serve_with_no_flags_speculates_on_the_embedded_model():
    with serve_process(None) as (base, _):
        metrics = _serve_code(base)
    assert _stat(metrics, "verify_steps") > 0
    assert _stat(metrics, "spec.accepted") > 0


def test_no_speculation_turns_it_off():
    with serve_process(None, "--no-speculation") as (base, _):
        metrics = _serve_code(base)
    assert _stat(metrics, "verify_steps") == 0 and _stat(metrics, "decode_steps") > 0
