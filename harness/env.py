"""The harness's environment switches, read in one place with one spelling of true and false.

A switch is an environment variable that turns something on or off (HARNESS_FUSED_CPU: the
fused CPU kernels; HARNESS_MALLOC: the allocator thresholds at import). Each is read with
:func:`switch`, which takes the spellings a shell user types (1/0, true/false, yes/no, on/off,
any case) and refuses anything else in one line: a typo such as `HARNESS_FUSED_CPU=flase` must
not leave the kernels on without a word. :func:`check_switches` reads every one of them, so the
command line refuses a bad value before any work (exit code 2).
"""
from __future__ import annotations

import os

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
# Every switch the harness reads, its default, and what it turns on. HARNESS_MALLOC also
# takes "system" (its first spelling, kept) for off.
SWITCHES = {
    "HARNESS_FUSED_CPU": (True, "the fused CPU kernels of the chunk forms"),
    "HARNESS_MALLOC": (True, "raising glibc's allocator thresholds at import"),
}
EXTRA_FALSE = {"HARNESS_MALLOC": ("system",)}


class EnvironmentSwitchError(ValueError):
    """An environment switch set to something that is neither true nor false (one line)."""


def switch(name: str, default: bool | None = None) -> bool:
    """The value of switch ``name``: its default (SWITCHES) when unset or empty; True or False for
    the usual spellings; EnvironmentSwitchError for anything else."""
    if default is None:
        default = SWITCHES[name][0]
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE or value in EXTRA_FALSE.get(name, ()):
        return False
    spellings = "/".join(f"{t}/{f}" for t, f in zip(TRUE, FALSE)) + "".join(
        f"/{extra}" for extra in EXTRA_FALSE.get(name, ()))
    raise EnvironmentSwitchError(f"{name}={raw!r} is neither true nor false: use one of {spellings} "
                                 f"({name} switches {SWITCHES.get(name, (None, 'a harness feature'))[1]})")


def check_switches() -> None:
    """Read every switch: EnvironmentSwitchError for the first that is set to something else."""
    for name in SWITCHES:
        switch(name)
