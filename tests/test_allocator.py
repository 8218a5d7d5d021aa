"""Importing harness sets the allocator for the process (harness.allocator), with an opt-out."""
import json
import os
import subprocess
import sys

import pytest

from harness.allocator import glibc_library

pytestmark = pytest.mark.skipif(glibc_library() is None, reason="the allocator configuration is glibc's")

# A plain process: import harness, then allocate and free a 64 MB tensor 24 times and count the
# minor page faults of the last 8 (a fresh mmap faults in all 16,384 of its pages every time).
# The first few blocks of a size are not reused: the few bytes torch's aligned allocation
# gives back sit in glibc's thread cache between the freed block and the top of the heap, until
# that cache is full (7 entries); from then on the same block returns.
PROBE = """
import json, resource
import harness
from harness.allocator import allocator_state
import torch
x = torch.ones(16 * 2**20)
faults = []
for i in range(24):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = x * 2
    del y
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"state": allocator_state(), "faults": sum(faults[16:])}))
"""


def probe(**env) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "HARNESS_MALLOC"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_configures_glibc_so_freed_tensors_are_reused():
    configured, system = probe(), probe(HARNESS_MALLOC="system")
    assert configured["state"]["configured"] and configured["state"]["reason"] == "mallopt at import"
    assert set(configured["state"]["set"]) == {"mmap_threshold", "trim_threshold"}
    assert not system["state"]["configured"] and system["state"]["reason"] == "HARNESS_MALLOC=system"
    assert system["faults"] >= 8 * 16384 * 0.9  # every allocation a fresh mapping
    assert configured["faults"] < 8 * 16384 * 0.1  # the freed block comes back


def test_a_threshold_set_in_the_environment_is_left_to_it():
    state = probe(MALLOC_TRIM_THRESHOLD_="1000000")["state"]
    assert state["from_environment"] == {"trim_threshold": "1000000"} and set(state["set"]) == {"mmap_threshold"}
