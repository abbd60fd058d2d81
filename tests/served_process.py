"""`gearshift serve` as a subprocess for end-to-end tests: started on a free loopback port,
waited for until /health answers 200 (or the process dies: its stderr is the failure),
stopped on exit (SIGTERM, then SIGKILL after 30 s).

Data flow (tests only): serve_process(model_dir, *flags) -> (base URL, Popen) -> the test.
"""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from gearshift.server.background import free_port

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def serve_process(model_dir, *flags: str, start_timeout: float = 120.0):
    port = free_port()
    model = [] if model_dir is None else [str(model_dir)]  # None: the embedded default model
    cmd = [sys.executable, "-m", "gearshift.cli", "serve", *model, "--port", str(port),
           "--device", "cpu", "--kv-cache-tokens", "2048", "--max-num-seqs", "4", *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
