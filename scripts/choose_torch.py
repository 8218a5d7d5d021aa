"""Print the pip arguments that install torch on this machine (scripts/setup.sh runs them).

- A CUDA device (nvidia-smi lists a GPU): the default index's torch, a CUDA build.
- No CUDA device: the CPU build of TORCH_VERSION from PyTorch's CPU wheel index, so that a
  CPU-only machine never downloads the multi-GB CUDA build; if that index cannot be reached
  (a machine that sees only a package mirror), the configured index's torch==TORCH_VERSION.

HARNESS_TORCH_CUDA=0|1 and HARNESS_CPU_INDEX_REACHABLE=0|1 override the two probes (the tests
use them); the standard library only, so that it runs before the virtual environment has anything.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request

TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def has_cuda() -> bool:
    forced = os.environ.get("HARNESS_TORCH_CUDA")
    if forced is not None:
        return forced == "1"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def cpu_index_reachable(timeout: float = 5.0) -> bool:
    forced = os.environ.get("HARNESS_CPU_INDEX_REACHABLE")
    if forced is not None:
        return forced == "1"
    try:
        with urllib.request.urlopen(f"{CPU_INDEX}/torch/", timeout=timeout) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def torch_install_args() -> tuple[list[str], str]:
    """(pip install arguments, the line that says why)."""
    if has_cuda():
        return ["torch"], "CUDA device found: a CUDA build of torch"
    if cpu_index_reachable():
        return [f"torch=={TORCH_VERSION}", "--index-url", CPU_INDEX], \
            f"no CUDA device: the CPU build torch=={TORCH_VERSION} from {CPU_INDEX}"
    return [f"torch=={TORCH_VERSION}"], \
        f"no CUDA device, {CPU_INDEX} unreachable: torch=={TORCH_VERSION} from the configured index"


if __name__ == "__main__":
    args, why = torch_install_args()
    print(why, file=sys.stderr)
    print(" ".join(args))
