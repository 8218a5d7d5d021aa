"""Interchange interventions by position (Arora et al. 2025): where a model binds a key to its value.

One query per example is followed: the last labelled one, whose value token the task names
(Batch.target_pos) and whose key token sits just before it (the recall and interference
layouts; with multi-token keys, the key's last token). One context token of that pair is
corrupted: its key, or its value, replaced by another token of the same half of the vocabulary
(keys [1, V/2), values [V/2, V)) that appears nowhere in the example. The clean and the corrupted
examples run once each; then the corrupted example runs again with the clean hidden state
restored at one (layer, component, role) at a time, every position of the role at once:

  component  hook points (harness.hooks)                      what a position holds there
  block_in   hook_embed (layer 0), layers.{i-1}.hook_resid_post  the residual entering block i
  core_in    layers.{i}.mixer.hook_q, hook_k, hook_v and, where  what the mixer's core is fed
             declared, hook_log_decay, hook_beta                 there: q, k, v after projection,
                                                                 short convolution and feature
                                                                 map (that token's state write)
  mixer_out  layers.{i}.hook_mixer_out                           the mixer's output, before the
                                                                 residual add
  block_out  layers.{i}.hook_resid_post                          the residual leaving block i

  role        positions
  key         the queried pair's key token (the one corrupted by key corruption)
  value       its value token
  between     every token strictly between the value token and the query
  query       the query token (the labelled position)
  other_pair  a control: the value token of another stored pair (the last one stored after the
              queried pair, else the nearest before), found from another labelled query's target_pos

The block-level points exist for every mixer, an outside one too; core_in needs the mixer's
hook_q, hook_k and hook_v laid out (B, H, T, d) and is skipped, with the reason, otherwise.
block_in of layer i > 0 is block_out of layer i - 1 (one hook point): computed once, reported
under both names.

Two numbers per row, over the examples the role has positions in: ``restored_prob``, the mean
probability of the right answer after restoring, and ``restored_share``, the share of the
clean-minus-corrupted logit difference that returns, where the logit difference of a run is
logit[right answer] - logit[the corrupted run's answer] (its highest-scoring token other than
the right one), averaged over examples before the ratio is taken (as harness.measure.ablate's
patching): 1 = all of it, 0 = none. Restoring the corrupted token itself at layer 0's input
gives back the clean run exactly (share 1); restoring where nothing of the corruption has
reached gives 0. What a map says is named by harness.measure.mechanism.

The restorations are edits of the model's own hook points (harness.hooks.intervene), not a
library made for interventions (pyvene, nnsight): the points already exist in every built-in
mixer and at every block of an outside one, so nothing is wrapped, forked or declared twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from harness.hooks import capture, hook_points, intervene as edited
from harness.tasks import IGNORE
from harness.tasks.base import batch_field

CORRUPTIONS = ("key", "value")
COMPONENTS = ("block_in", "core_in", "mixer_out", "block_out")
ROLES = ("key", "value", "between", "query", "other_pair")
EMBED = "hook_embed"
CORE_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_log_decay", "hook_beta")
MIN_SPAN = 1e-6  # logits: a corruption that moves the logit difference less has no share to restore


@dataclass(frozen=True)
class Queried:
    """The followed query of each kept example (all (B,) long): where its query, key and value
    tokens sit, the control pair's value (-1: none), and the right answer."""
    inputs: torch.Tensor   # (B, T) the kept examples
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    other: torch.Tensor
    answer: torch.Tensor


def queried_pairs(inputs: torch.Tensor, targets: torch.Tensor, target_pos: torch.Tensor,
                  vocab_size: int) -> Queried:
    """The last labelled query of each example whose answer is a value token right after a key
    token (the recall and interference layouts); ValueError (one line) when no example has one."""
    labelled = (targets != IGNORE) & (target_pos >= 1)  # (B, T)
    t = inputs.shape[1]
    order = torch.arange(t, device=inputs.device).expand_as(labelled)
    query = torch.where(labelled, order, -1).max(dim=1).values  # (B,) last labelled position
    rows = torch.arange(inputs.shape[0], device=inputs.device)
    value = target_pos[rows, query.clamp(min=0)]
    key = value - 1
    half = vocab_size // 2
    answer = targets[rows, query.clamp(min=0)]
    key_token, value_token = inputs[rows, key.clamp(min=0)], inputs[rows, value.clamp(min=0)]
    keep = ((query >= 0) & (key >= 0) & (value_token == answer) & (value_token >= half)
            & (key_token >= 1) & (key_token < half))
    if not bool(keep.any()):
        raise ValueError("intervene: no example of this batch has a labelled query whose answer is a value "
                         "token right after a key token (keys in [1, V/2), values in [V/2, V), as the recall "
                         "and interference tasks lay them out)")
    # the control: another labelled query's value position (a stored pair other than the queried
    # one), the farthest after the queried value, so that the corruption can reach it (a position
    # before the corrupted token holds the same state in both runs) but a short convolution over
    # the corrupted key most likely cannot; else the nearest before
    others = torch.where(labelled & (target_pos != value[:, None]), target_pos, -1)  # (B, T)
    after = others.max(dim=1).values
    before = torch.where(others < value[:, None], others, -1).max(dim=1).values
    other = torch.where(after > value, after, before)
    return Queried(inputs[keep], query[keep], key[keep], value[keep], other[keep], answer[keep])


def replace_token(inputs: torch.Tensor, at: torch.Tensor, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    """``inputs`` with the token at position ``at[b]`` of each example replaced by a token of the
    same half of the vocabulary drawn uniformly among those nowhere in the example; ValueError
    when an example's half has no such token (raise task.vocab_size)."""
    b, rows = inputs.shape[0], torch.arange(inputs.shape[0], device=inputs.device)
    old = inputs[rows, at]
    half = vocab_size // 2
    present = torch.zeros(b, vocab_size, dtype=torch.bool, device=inputs.device)
    present.scatter_(1, inputs, True)
    token = torch.arange(vocab_size, device=inputs.device)
    in_half = torch.where((old >= half)[:, None], token >= half, (token >= 1) & (token < half))  # (B, V)
    free = in_half & ~present
    if not bool(free.any(dim=1).all()):
        raise ValueError("intervene: an example uses every token of a vocabulary half, so no token can "
                         "replace one of its pair; raise task.vocab_size")
    new = torch.multinomial(free.float().cpu(), 1, generator=generator).squeeze(1).to(inputs.device)
    out = inputs.clone()
    out[rows, at] = new
    return out


def role_positions(q: Queried) -> dict[str, torch.Tensor]:
    """(B, T) bool per role: the positions restored together."""
    b, t = q.inputs.shape
    order = torch.arange(t, device=q.inputs.device).expand(b, t)
    one = lambda pos: order == pos[:, None]  # noqa: E731  (B, T), none where pos is -1
    return {"key": one(q.key), "value": one(q.value),
            "between": (order > q.value[:, None]) & (order < q.query[:, None]),
            "query": one(q.query), "other_pair": one(q.other)}


def points(model) -> tuple[dict[tuple[int, str], tuple[str, ...]], dict[str, str]]:
    """{(layer, component): the hook points restored together} and {what: why skipped}."""
    names = hook_points(model)
    found, skipped = {}, {}
    for i in range(len(model.layers)):
        found[i, "block_in"] = (EMBED if i == 0 else f"layers.{i - 1}.hook_resid_post",)
        core = tuple(f"layers.{i}.mixer.{h}" for h in CORE_HOOKS if f"layers.{i}.mixer.{h}" in names)
        if {f"layers.{i}.mixer.{h}" for h in CORE_HOOKS[:3]} <= set(core):
            found[i, "core_in"] = core
        else:
            skipped[f"layer {i} core_in"] = ("skipped: the mixer declares no hook_q, hook_k and hook_v "
                                             "(harness.layers.protocol) to restore its state write at a position")
        found[i, "mixer_out"] = (f"layers.{i}.hook_mixer_out",)
        found[i, "block_out"] = (f"layers.{i}.hook_resid_post",)
    return found, skipped


def _position_axis(name: str) -> int:
    """Where a hook point's positions lie: dim 1 of the residual stream (B, T, C), dim 2 inside a
    mixer (B, H, T, ...)."""
    return 2 if ".mixer." in name else 1


def _put(clean: torch.Tensor, where: torch.Tensor, axis: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit that puts ``clean`` back at the positions ``where`` (B, T) of a hook's tensor."""
    shape = [where.shape[0]] + [1] * (clean.dim() - 1)
    shape[axis] = where.shape[1]
    mask = where.reshape(shape)  # (B, T, 1) or (B, 1, T, 1, ...)
    return lambda x: torch.where(mask, clean.to(x.dtype), x)


def _laid_out(t: torch.Tensor, axis: int, b: int, length: int) -> bool:
    return t.dim() > axis and t.shape[0] == b and t.shape[axis] == length


def _scores(logits: torch.Tensor, answer: torch.Tensor, alt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example (B,): the probability of the right answer and logit[answer] - logit[alt], in float64."""
    logits = logits.double()
    prob = logits.softmax(-1).gather(1, answer[:, None]).squeeze(1)
    diff = (logits.gather(1, answer[:, None]) - logits.gather(1, alt[:, None])).squeeze(1)
    return prob, diff


def _row(corrupt: str, layer: int, component: str, role: str, clean, bad, restored,
         has: torch.Tensor) -> dict[str, Any]:
    """One row: the means over the examples the role has positions in (``has``, (B,) bool)."""
    n = int(has.sum())
    mean = (lambda t: float(t[has].mean())) if n else (lambda t: float("nan"))  # noqa: E731
    span = mean(clean[1]) - mean(bad[1])
    share = (mean(restored[1]) - mean(bad[1])) / span if n and abs(span) >= MIN_SPAN else float("nan")
    return {"corrupt": corrupt, "layer": layer, "component": component, "role": role,
            "restored_prob": mean(restored[0]), "restored_share": share, "clean_prob": mean(clean[0]),
            "corrupted_prob": mean(bad[0]), "examples": n}


@torch.no_grad()
def intervene(model, batch, *, seed: int = 0, corruptions=CORRUPTIONS,
              max_examples: Optional[int] = None) -> dict[str, Any]:
    """Interchange interventions on a task batch (a Batch, or a dict with inputs, targets and
    target_pos) at one length: its first ``max_examples`` examples (None: all).

    Returns {"rows": one per (corrupt, layer, component, role) with restored_prob,
    restored_share, clean_prob, corrupted_prob and examples (the examples the role has
    positions in; a role with none in any example has NaN numbers), "skipped": {what: why},
    "examples": the examples followed, "seq_len"}. ``seed`` draws the replacement tokens. The
    model's mode is restored."""
    unknown = sorted(set(corruptions) - set(CORRUPTIONS))
    if unknown:
        raise ValueError(f"intervene: unknown corruption {', '.join(unknown)}; valid: {', '.join(CORRUPTIONS)}")
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        q = queried_pairs(*(batch_field(batch, f)[:max_examples].to(device) for f in ("inputs", "targets", "target_pos")),
                          vocab_size=model.vocab_size)
        b, length = q.inputs.shape
        where = role_positions(q)
        has = {role: m.any(dim=1) for role, m in where.items()}
        found, skipped = points(model)
        at = q.query[:, None]  # (B, 1): the logits are read at the query alone
        with capture(model, names={n for names in found.values() for n in names}) as cache:
            clean_logits = model(q.inputs, at)[:, 0]  # (B, V)
        clean_states = dict(cache)
        for (layer, component), names in list(found.items()):
            if not all(_laid_out(clean_states[n], _position_axis(n), b, length) for n in names):
                del found[layer, component]
                skipped[f"layer {layer} {component}"] = "skipped: a hook tensor is not laid out (B, H, T, ...)"
        rows = []
        for corrupt in corruptions:
            generator = torch.Generator().manual_seed(seed * len(CORRUPTIONS) + CORRUPTIONS.index(corrupt))
            bad_inputs = replace_token(q.inputs, q.key if corrupt == "key" else q.value, model.vocab_size, generator)
            bad_logits = model(bad_inputs, at)[:, 0]
            # the corrupted run's answer: its best token other than the right one
            alt = bad_logits.scatter(1, q.answer[:, None], float("-inf")).argmax(-1)
            clean, bad = _scores(clean_logits, q.answer, alt), _scores(bad_logits, q.answer, alt)
            done: dict[tuple, tuple] = {}  # block_in of layer i is block_out of layer i - 1
            for (layer, component), names in found.items():
                for role in ROLES:
                    if (names, role) not in done:
                        edits = {n: _put(clean_states[n], where[role], _position_axis(n)) for n in names}
                        with edited(model, edits):
                            done[names, role] = _scores(model(bad_inputs, at)[:, 0], q.answer, alt)
                    rows.append(_row(corrupt, layer, component, role, clean, bad, done[names, role], has[role]))
    finally:
        model.train(was_training)
    return {"rows": rows, "skipped": skipped, "examples": b, "seq_len": length}


def intervene_run(model, config, *, examples: int = 256, seed: int = 1_000_003) -> dict[str, Any]:
    """`intervene` on a finished run's model (harness.load_run(...).model) and config, at its
    task's first test setting: what mode=intervene computes, with the same defaults (the batch
    drawn as mode=ablate draws its own)."""
    from harness.measure.ablate import task_batches

    batch, _, _ = task_batches(config.task, examples, seed)
    return intervene(model, batch, seed=seed)
