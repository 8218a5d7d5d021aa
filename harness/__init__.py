"""recall-harness: a mechanistic evaluation harness for long-context recall.

`python -m harness task=<t> model=<m> [overrides]` trains and measures one model; in Python,
`harness.ops` holds the mixer cores, `harness.features` the feature maps, `harness.hooks`
the hook points, and `harness.load_run(run_dir)` reopens a finished run.

Importing the package sets the process's allocator configuration (harness.allocator: glibc
keeps freed memory for reuse instead of unmapping it; HARNESS_MALLOC=system opts out), so
that the CLI, the benchmark and a notebook calling harness.ops all run alike.
"""
from __future__ import annotations

from harness import allocator

allocator.configure()


def load_run(run_dir, *, device="cpu", trust_code=False):
    """A finished run's model (trained weights), config and results: harness.outputs.load.Run.
    ``trust_code=True`` allows a run whose config names outside code (a dotted model.name, a
    hybrid's slot or model.attn, a task module: harness.outputs.trust), which loading imports and
    runs; built-in mixers and tasks need nothing."""
    from harness.outputs.load import load_run as load

    return load(run_dir, device=device, trust_code=trust_code)


def ablate(model, batch, reference=None, **options):
    """Recall of `model` on a task batch with each layer and head removed (zero, mean and
    resample ablation), each head patched from clean into corrupted examples (query, key or
    value), path patching between heads, and each head's weights:
    harness.measure.ablate.ablate (harness.measure.ablate.ablate_run for a loaded run)."""
    from harness.measure.ablate import ablate as run_ablation

    return run_ablation(model, batch, reference, **options)


def intervene(model, batch, **options):
    """Interchange interventions of `model` on a task batch: one context token of each followed
    query's pair corrupted (its key, or its value), the clean hidden state restored at one
    (layer, component, role) at a time: harness.measure.intervene.intervene (intervene_run for a
    loaded run; harness.measure.mechanism.mechanism_label names the mechanism its rows show)."""
    from harness.measure.intervene import intervene as run_interventions

    return run_interventions(model, batch, **options)
