"""Ask JAX about this machine's devices in a subprocess, so that this process's backend stays unstarted (the GPU
mock and the TPU compile-only devices must be configured before it starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_probe(code: str, platforms: str, python: str = sys.executable,
              timeout_s: float = 120.0) -> dict[str, Any] | str:
    """Run ``code`` with JAX limited to ``platforms`` in a subprocess (this process's backend stays unstarted) and
    return the JSON object it printed last, or why there is none."""
    env = {**os.environ, "JAX_PLATFORMS": platforms}
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"did not finish in {timeout_s:g} s"
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        data = None
    return data if isinstance(data, dict) else f"failed: {proc.stderr.strip()[-300:] or 'no output'}"
