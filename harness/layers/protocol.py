"""The mixer protocol: what the harness knows about a mixer, read off the mixer itself.

A mixer is any nn.Module whose forward maps (B, T, C) to (B, T, C) (or returns a tuple whose
first element is that tensor, as fla's layers return (o, attn, cache)). Everything else is
optional; each member a mixer declares switches on the measurements that need it, and a
measurement whose member is missing is skipped, with the reason written to results.json
(`"measure": {"sharpness": "skipped: no effective_weights"}`). Built-in mixers declare all of
them through :class:`Mixer`; an outside mixer declares what it can.

  member                      type                       buys
  --------------------------  -------------------------  -----------------------------------
  family                      str                        theory and probe: "softmax",
                                                         "linear" (normalised additive state),
                                                         "decay" (decayed additive state),
                                                         "delta" (delta-rule state)
  core                        str                        mode=cost and the bench: the
                                                         harness.ops core it runs (softmax,
                                                         linear, decay_scalar, decay_per_dim,
                                                         delta, delta_gated, softmax_window)
  d_key, d_head, n_heads      int                        predicted SNR sqrt(d_key / N_eff)
  kernel                      str                        theory.kernel_effective_dim name
                                                         (identity, elu1, favor, taylor, softmax,
                                                         dpfp<nu>)
  positive_denominator        bool                       fault checks: phi(q).z must stay > 0
  state_size(sequence_length) int, elements per layer    state bytes in results.json; called by
                                                         keyword (sequence_length=T, batch_size=1
                                                         when taken), guarded: a failure is skipped
  hook_q, hook_k, hook_v,     HookPoint (harness.hooks)  what measurement reads; hook_q/hook_k
  hook_out, hook_q_raw,                                  are exactly what the op is fed,
  hook_k_raw, hook_log_decay,                            hook_*_raw before any feature map
  hook_beta
  effective_weights(hooks,    (B, H, R, T) tensor        sharpness and the read-out split
    rows=None)                                           (signal against crosstalk)
  decay_heads_for(config)     int (classmethod,          the scalar decays per q/k head (RetNet's
                              default 1)                 and Mamba-2's decay heads): the memory
                                                         estimate counts the fused kernel's kept
                                                         decay masks by them
  heads_per_readout           int (default 1)            trained-statistics theory: that many
                                                         consecutive heads of effective_weights
                                                         are concatenated into one read-out
                                                         (mamba's decay heads of a q/k group)
  probe_memory(d, seed)       ProbeMemory (classmethod)  mode=probe: the untrained probe
  probe_on_request            bool (default False)       left out of the probe's default list
  wants_learned_positions     bool                       model.pos_emb default (learned for
                                                         softmax, none otherwise)
  Options                     dataclass (built-ins)      its own settings, filled from
                                                         model.options and checked by the
                                                         harness (harness.layers.options)
  check_config(config)        staticmethod, raises       harness.model.validate: what only this
                              ValueError (one line)      mixer requires of the whole config
                                                         (mamba: model.options.mamba_heads
                                                         divides d_head)
  form                        str, settable              model.form / LanguageModel.set_form
  memory_kind                 str                        state accounting: "state" (fixed
                                                         size) or "kv_cache" (grows with the
                                                         length); default: read off state_size
                                                         at T and 2T
  tags                        frozenset of str           experiments choose mixers by them
                                                         (harness.config.mixers): "gated"

Any attribute above may be declared as `harness_<member>` (`harness_kernel = "elu1"`) where the
mixer uses the plain name itself (H3's `kernel` is its SSM kernel); an attribute that is a
module, tensor or function is the mixer's own and is ignored (recorded, never warned about).

The harness constructs a mixer with the keyword arguments its constructor names among
`d_model` (alias `hidden_size`), `n_heads` (alias `num_heads`), `layer_idx` and `config` (the
whole ModelConfig), plus every entry of `model.options` (harness.layers.registry).
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Optional

import torch
from torch import nn

from harness.hooks import HookPoint
from harness.layers.options import Options
from harness.layers.parts import Rotary, ShortConv, qk_width, rotary_enabled, split_heads

MEMORY_KINDS = ("state", "kv_cache")
HOOKS = ("hook_q_raw", "hook_k_raw", "hook_q", "hook_k", "hook_v", "hook_log_decay", "hook_dt",
         "hook_beta", "hook_out")


class ProbeMemory(NamedTuple):
    """How the untrained probe (harness.measure.probe) writes random pairs into a mixer's memory.

    read: "state" (S = sum_j lam_j phi(k_j) v_j^T, read through the state), "delta" (the
    delta rule with beta = 1: S_t = a_t (I - k_t k_t^T) S_{t-1} + k_t v_t^T, phi(k) of unit
    norm, read through the state) or "softmax" (exact softmax over the stored keys; over the
    last `window` of them when window is set). phi_k / phi_q map (B, c, d) -> (B, c, m); d_key is
    m. normalize: divide the read-out by phi(q).z. decay: None, or a callable
    (shape (B, N), generator) -> (log a (B, N), write scale (B, N) or None) drawing the
    per-step decays of the mixer's initialisation. kernel: the theory.kernel_effective_dim name
    of this memory where it depends on the mixer's options (DPFP's "dpfp2"); None: the class's
    `kernel`.
    """
    read: str
    phi_k: Optional[Callable] = None
    phi_q: Optional[Callable] = None
    d_key: int = 0
    normalize: bool = False
    decay: Optional[Callable] = None
    window: Optional[int] = None
    kernel: Optional[str] = None


def identity_map(x: torch.Tensor) -> torch.Tensor:
    return x


def mixer_hooks(mixer: nn.Module, cache: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The captured hook tensors of one mixer by short name ("q", "k", "v", "log_decay", ...)."""
    return {name[len("hook_"):]: cache[f"{prefix}{name}"] for name in HOOKS if f"{prefix}{name}" in cache}


def lacks(mixer: nn.Module, *members: str) -> Optional[str]:
    """The first protocol member `mixer` does not declare, as a skip reason; None if it has all."""
    for member in members:
        if getattr(mixer, member, None) is None:
            return f"skipped: no {member}"
    return None


def state_size(mixer: nn.Module, sequence_length: int) -> Optional[int]:
    """mixer.state_size(sequence_length=T) (and batch_size=1 when it takes one) in elements per
    layer; None if it declares none, or if the call fails (skipped with the reason, warned once:
    harness.layers.preflight.call_state_size)."""
    from harness.layers.preflight import call_state_size

    return call_state_size(mixer, sequence_length)


def head_count(mixer: nn.Module) -> Optional[int]:
    """The mixer's own head count: its n_heads member, else the head count the harness built it
    with (an n_heads / num_heads constructor argument, model.options included), else a num_heads
    attribute (Zoology's); None when it says none."""
    from harness.layers.preflight import member
    from harness.layers.registry import built_with

    declared = member(mixer, "n_heads")
    if declared:
        return declared
    passed = built_with(mixer).get("kwargs", {})
    for value in (passed.get("n_heads"), passed.get("num_heads"), getattr(mixer, "num_heads", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def memory_kind(mixer: nn.Module, sequence_length: int) -> Optional[str]:
    """"state" (a fixed size whatever the length) or "kv_cache" (grows with the length, up to a
    window): the mixer's memory_kind member, else read off state_size at T and 2T; None when it
    declares no state_size."""
    from harness.layers.preflight import member

    declared = member(mixer, "memory_kind")
    if declared in MEMORY_KINDS:
        return declared
    at, twice = state_size(mixer, sequence_length), state_size(mixer, 2 * sequence_length)
    if at is None or twice is None:
        return None
    return "kv_cache" if twice > at else "state"


def layer_memory(mixer: nn.Module, d_model: int, sequence_length: int) -> dict:
    """One layer's decoding memory at `sequence_length`, by the mixer's own numbers: its kind
    (memory_kind), elements in all (state_size) and per head (over head_count), its d_head
    (declared, else d_model over its head count) and d_key. Unknowns are None."""
    from harness.layers.preflight import member
    from harness.layers.registry import built_with

    heads = head_count(mixer)
    d_head = member(mixer, "d_head") or (d_model // heads if heads and d_model % heads == 0 else None)
    elements = state_size(mixer, sequence_length)
    longer = state_size(mixer, 2 * sequence_length)  # a window's cache stops growing at the window
    return {"mixer": built_with(mixer).get("mixer", type(mixer).__qualname__),
            "kind": memory_kind(mixer, sequence_length), "elements": elements, "n_heads": heads,
            "grows": None if elements is None or longer is None else longer > elements,
            "elements_per_head": elements // heads if elements is not None and heads else None,
            "d_head": d_head, "d_key": member(mixer, "d_key")}


class Mixer(nn.Module):
    """Base of the built-in mixers: head geometry, q/k/v projection, short convolution, rotary,
    and the hook points measurement reads.

    Hook points (all (B, H, T, .)):
      hook_q_raw, hook_k_raw  q and k before the feature map (after rotary / scaling); their
                              dot product is the score that monotonicity is measured against
      hook_q, hook_k          exactly what is fed to the op (feature-mapped for kernel mixers)
      hook_v                  values as fed to the op (dt-scaled for mamba)
      hook_log_decay          decay mixers only: (B, H, T) or (B, H, T, Dk)
      hook_beta               delta-rule mixers only: (B, H, T) write strengths
      hook_out                the op's read-out, before per-head norm, gate and output projection

    Subclasses set `family`, `core` and `kernel`, set `d_key` when a feature map changes the
    key side of the state, and implement `effective_weights(hooks, rows)` with the ops
    weights function of the op their forward pass calls, and `state_size`.
    """

    family: str = ""
    core: str = ""
    kernel: Optional[str] = None
    positive_denominator: bool = False
    # Its weights a_ij are, row by row, an increasing function of softmax's score on hook_q_raw and
    # hook_k_raw (softmax; the identity map undivided): Hedgehog's monotonicity is then 1 by the
    # map, whatever was learned, and no finding. Declared, not read off the measured value, which
    # float32 or bf16 rounding of near ties takes below 1.
    monotone_in_score: bool = False
    wants_learned_positions: bool = False
    has_decay: bool = False
    fixed_decays: bool = False  # its decays are constants per head, not learned or data-dependent (retnet)
    heads_per_readout: int = 1  # consecutive effective-weight heads read out together
    memory_kind: str = "state"  # what decoding keeps: a fixed state, or a KV cache (softmax, swa)
    # What else it is, for experiments that choose mixers by it (${mixers:{where: {tags: gated}}}):
    # "gated", a data-dependent decay in front of the state (mamba, gated_deltanet)
    tags: frozenset = frozenset()
    probe_on_request: bool = False  # run_probe's default list leaves it out (features too large)
    init_by_model: bool = True  # the language model's Xavier / unit-embedding init applies
    # Its own settings (harness.layers.options), filled from model.options: options_of(config)
    Options: type = Options

    @classmethod
    def options_of(cls, config) -> Options:
        """This mixer's typed options for a (slot's) ModelConfig: the entries of its
        model.options that the mixer declares, the rest at their defaults (all of them for no
        config: a class asked without one, as the probe and estimates ask)."""
        return cls.Options.of(getattr(config, "options", None))

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = config.n_heads
        self.d_head = config.d_model // config.n_heads  # width of v and of the read-out
        self.d_qk = qk_width(config)                    # width of q and k before any feature map
        self.d_key = self.d_qk                          # key side of the state (feature maps change it)
        self.hook_q_raw, self.hook_k_raw = HookPoint(), HookPoint()
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_out = HookPoint()
        self.rotary = Rotary(self.d_qk) if rotary_enabled(config) else None
        self.qkv_sizes = (self.n_heads * self.d_qk, self.n_heads * self.d_qk, config.d_model)
        self.qkv_proj = nn.Linear(config.d_model, sum(self.qkv_sizes), bias=False)
        # The short convolution acts on q, k and v after their projection, each channel on its
        # own (Mamba-2's conv over xBC; fla's q/k/v convs). So k can be the previous token's key
        # while q stays the current token's: one layer can then write (key, value) pairs.
        self.qkv_conv = ShortConv(sum(self.qkv_sizes), config.conv_size) if config.short_conv else None
        if self.has_decay:
            self.hook_log_decay = HookPoint()

    @classmethod
    def core_for(cls, config) -> str:
        """`core` for a config, known without building the mixer (a gate may choose it)."""
        return cls.core

    @classmethod
    def decay_heads_for(cls, config) -> int:
        """Scalar decays per q/k head, known without building the mixer: 1 unless the mixer splits
        its heads into decay heads (retnet, mamba)."""
        return 1

    @classmethod
    def key_width(cls, d_qk: int, config=None) -> int:
        """The key side of the state per head (d_key) for q and k of width d_qk, known without
        building the mixer (resource estimates, the probe); a feature map changes it."""
        return d_qk

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (B, H, T, d_qk) and v (B, H, T, d_head) of x (B, T, C): projected, then
        short-convolved if on."""
        qkv = self.qkv_proj(x)
        if self.qkv_conv is not None:
            qkv = self.qkv_conv(qkv)
        q, k, v = (split_heads(t, self.n_heads) for t in qkv.split(self.qkv_sizes, dim=-1))
        return q, k, v

    def state_size(self, sequence_length: int = 2048) -> int:
        """Elements one layer keeps to decode the next token (all heads)."""
        raise NotImplementedError

    def effective_weights(self, hooks: Mapping[str, torch.Tensor], rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """a_ij of the rows `rows` ((R,) positions; None: every position), (B, H, R, T), built
        for those rows alone (the ops weights functions take `rows`): O(R T) memory."""
        raise NotImplementedError
