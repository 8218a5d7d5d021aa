"""The rule that names a run's recall mechanism from its interchange map (harness.measure.intervene).

Fixed before any run of the mechanism experiments (harness/conf/experiment/mechanism.yaml says
so); it reads the key-corruption rows only, since a corrupted key is what an association must
carry from the pair to the query, and goes down this list, naming the first that holds:

1. ``not learned``: the clean run gives the right answer a mean probability below
   LEARNED_PROB (0.5, worse than even odds on the followed queries). A map of a model that did
   not learn says nothing about how recall is done.
2. ``mixed/none``, the corruption has no effect: corrupting the key takes less than MIN_EFFECT
   (0.25) of probability from the right answer, so every share is a ratio of small
   differences.
3. ``mixed/none``, the control leaks: restoring the value token of another stored pair
   (``other_pair``) at any layer and block-level component (block_in, mixer_out, block_out)
   gives back NONE_SHARE (0.2) or more. A token that holds nothing of the queried pair restoring
   the answer means the map is not specific to positions (a state-wide effect), and no position
   can be named. (Not core_in: a short convolution feeds the corrupted key straight into the
   writes of the few tokens after it, which a stored pair can be.)
4. ``value-token binding (induction)``: restoring the value token's residual at the output of
   some block before the last (``block_out``, layer < L - 1) gives back BIND_SHARE (0.5) or more
   of the effect. The key has been copied into the value token's hidden state by then, and a
   later layer reads the pair from there: the induction mechanism Arora et al. (2025) find in
   attention and in Based. (The last block's output at a context position cannot reach the
   query: excluded by construction.)
5. ``short-convolution binding``: restoring what the mixer's core is fed (``core_in``: its q,
   k, v, decay and write strength) at the value token, or at the tokens between it and the
   query, gives back BIND_SHARE or more at a layer whose input residual there (``block_in``)
   gives back less: the key reached a later token's state write inside the mixer, not through
   the residual stream. In every built-in mixer the only token mixing before the core is the
   short convolution (model.short_conv), which reaches conv_size - 1 tokens back: the write that
   pairs the key with its value sits at the value token or one of the few after it (the delta
   rule's is often the next one). This is Arora et al.'s Mamba, which does induction by its
   convolution, not its state. (For an outside mixer, whatever mixes neighbouring tokens inside
   it before its core.)
6. ``last-state / query retrieval``: no context position but the corrupted key itself (the value
   token and every token between it and the query) restores NONE_SHARE or more at any block-level
   component (block_in, mixer_out, block_out), and the query position restores BIND_SHARE or more
   at some component other than the last block's output (which restores everything, for any
   model, by construction). The association is then formed only when the query reads the
   state: what Arora et al. find in H3 and Hyena.
7. ``mixed/none``: anything else (a share between the thresholds, or binding spread over
   positions).

The thresholds: BIND_SHARE = 0.5 names a position only when it alone carries most of the
effect, which at most one of two alternative routes can; NONE_SHARE = 0.2 calls a position
empty when it gives back less than a fifth (the other_pair control reads near 0 in a model that
binds locally, so 0.2 sits well above its noise over a few hundred examples). Shares, not
probabilities: a share is normalised by the corruption's own effect, so models whose clean
answers differ in confidence compare on one scale. Arora et al. read their maps by eye
(restored probability per position and layer); their code (tinylang/eval/interchange.py)
summarises a position by its mean restored probability, maximised over layers, with no
numeric cut-off: the positions and components read here follow theirs, the thresholds are ours.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

NOT_LEARNED = "not learned"
INDUCTION = "value-token binding (induction)"
CONVOLUTION = "short-convolution binding"
LAST_STATE = "last-state / query retrieval"
MIXED = "mixed/none"
LABELS = (INDUCTION, CONVOLUTION, LAST_STATE, MIXED, NOT_LEARNED)

LEARNED_PROB = 0.5
MIN_EFFECT = 0.25
BIND_SHARE = 0.5
NONE_SHARE = 0.2
BLOCK_LEVEL = ("block_in", "mixer_out", "block_out")


def _records(rows) -> list[Mapping[str, Any]]:
    return rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)


def _max(values: Iterable[float]) -> float:
    """The largest finite value (NaN: a role with no positions, or no effect); -inf if none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return max(finite, default=-math.inf)


def evidence(rows) -> dict[str, float]:
    """The numbers the rule reads from one run's rows (key corruption): clean_prob, effect
    (clean minus corrupted probability of the right answer), control (other_pair's largest
    block-level share), residual_binding (value token, block_out before the last layer), write_binding
    (value token or those between, core_in, where block_in there gives back less than
    BIND_SHARE), context (value
    and between, block-level, largest share), query (query, largest share but the last
    block_out); -inf where nothing was measured."""
    key = [r for r in _records(rows) if r["corrupt"] == "key"]
    if not key:
        raise ValueError("mechanism: no key-corruption rows (harness.measure.intervene corrupt='key')")
    last = max(int(r["layer"]) for r in key)
    share = {(int(r["layer"]), r["component"], r["role"]): r["restored_share"] for r in key}
    clean, bad = _max(r["clean_prob"] for r in key), _max(r["corrupted_prob"] for r in key)
    return {
        "clean_prob": clean,
        "effect": clean - bad,
        "control": _max(v for (_, comp, role), v in share.items() if role == "other_pair" and comp in BLOCK_LEVEL),
        "residual_binding": _max(share.get((layer, "block_out", "value")) for layer in range(last)),
        "write_binding": _max(share.get((layer, "core_in", role)) for layer in range(last + 1)
                              for role in ("value", "between")
                              if not _max([share.get((layer, "block_in", role))]) >= BIND_SHARE),
        "context": _max(v for (_, comp, role), v in share.items() if role in ("value", "between") and comp in BLOCK_LEVEL),
        "query": _max(v for (layer, comp, role), v in share.items()
                      if role == "query" and (layer, comp) != (last, "block_out")),
    }


def mechanism_label(rows) -> str:
    """The mechanism one run's interchange rows show, by the rule of this module's docstring."""
    e = evidence(rows)
    if e["clean_prob"] < LEARNED_PROB:
        return NOT_LEARNED
    if e["effect"] < MIN_EFFECT or e["control"] >= NONE_SHARE:
        return MIXED
    if e["residual_binding"] >= BIND_SHARE:
        return INDUCTION
    if e["write_binding"] >= BIND_SHARE:
        return CONVOLUTION
    if e["context"] < NONE_SHARE and e["query"] >= BIND_SHARE:
        return LAST_STATE
    return MIXED
