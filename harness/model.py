"""The language model: token embedding, pre-norm blocks (mixer + MLP, or the mixer alone), final
norm, output head.

Read top to bottom: the config and its validation, the block, the model. The mixers (one
module per family under harness/layers/) own their projections, feature maps, gates and
norms and call harness.ops; this file only wires them together.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import nn

from harness import checks
from harness.hooks import HookPoint
from harness.layers import MLP, make_norm, registry
from harness.layers.options import lift
from harness.layers.parts import NORMS, qk_width
from harness.layers.preflight import member
from harness.layers.protocol import layer_memory, state_size
from harness.ops.common.guards import FORMS

POS_EMBS = ("none", "learned")


def open_mapping():
    """An empty mapping that accepts new keys inside Hydra's struct-mode config (a plain dict
    outside OmegaConf would be closed once Hydra sets struct mode on the composed config)."""
    from omegaconf import OmegaConf

    return OmegaConf.create({}, flags={"struct": False})


@dataclass(frozen=True)
class Stack:
    """A model's layers as the build, validation, the memory estimate and grouping read them,
    derived once (stack_of): each layer's ModelConfig (layer_configs) and mixer class, and whether
    the model has learned absolute positions."""
    slots: tuple["ModelConfig", ...]
    mixers: tuple[type, ...]
    learned_positions: bool


def stack_of(cfg: "ModelConfig") -> Stack:
    """cfg's stack. Learned positions: model.pos_emb, or the mixers' own default when null,
    learned absolute positions for a mixer with no other position signal (softmax, as in GPT-2
    and Zoology's attention baseline). A hybrid gets them only when every slot wants them: its
    recurrent layers carry position (as in Jamba, whose attention layers have no positional
    encoding), and learned positions would bar it from the lengths past training that its
    long-context evaluation needs."""
    slots = tuple(layer_configs(cfg))
    mixers = tuple(registry.resolve(slot.name) for slot in slots)
    learned = (cfg.pos_emb == "learned" if cfg.pos_emb is not None
               else all(getattr(cls, "wants_learned_positions", False) for cls in mixers))
    return Stack(slots, mixers, learned)


@dataclass
class ModelConfig:
    name: str = registry.DEFAULT_MIXER  # a built-in mixer (harness.layers) or a dotted path package.module.Class
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 1
    mlp_ratio: int = 4
    short_conv: bool = True  # causal depthwise convolution of q, k, v after their projection
    conv_size: int = 4
    rotary: Optional[bool] = None  # None: the model's default (off: softmax uses learned positions)
    pos_emb: Optional[str] = None  # none | learned; None: learned for softmax, none otherwise
    form: str = "chunk"  # training form of the linear families: chunk | parallel | recurrent
    qk_dim: Optional[int] = None  # per-head width of q and k (None: d_model / n_heads); Based's feature_dim
    chunk_size: int = 64
    mlp: bool = True  # false: blocks of the sequence mixer alone, x + mixer(norm(x)) (Zoology's MQAR configs)
    dropout: float = 0.0
    norm: str = "layernorm"  # block norms: layernorm | rmsnorm
    tie_embeddings: bool = False  # share the input embedding with the output head
    # The mixer's own settings: a built-in's typed Options (harness.layers.options: FAVOR+'s
    # favor_features, retnet's retnet_heads, swa's window, ...), or the keyword arguments of an
    # outside mixer's constructor, any keys (model.options.window=8 from the command line needs
    # no '+': the node is created open, not struct, in the schema). In a hybrid a built-in slot
    # reads the built-in options, an outside slot gets them all.
    options: Any = field(default_factory=open_mapping)
    # Hybrids (harness.model.layer_configs). `layers`: one mixer per layer, each a name (built-in
    # or dotted path) or a mapping {name: swa, window: 16} whose other keys override model.* (or
    # set the slot's options) for that slot; its length is the depth. `attn_every`: the short form, model.name in every layer
    # but each k-th (layers k-1, 2k-1, ...: 3 Gated DeltaNet layers to 1 attention layer at k=4),
    # which is `attn` (a name or such a mapping).
    layers: Optional[list[Any]] = None
    attn_every: Optional[int] = None
    attn: Any = registry.DEFAULT_ATTENTION

    def __init__(self, **settings: Any) -> None:
        """The dataclass's own init, after the old model.* keys of a mixer's settings
        (model.window=16) are moved into `options` (harness.layers.options.lift): a config or
        checkpoint written before the move builds the same model."""
        settings = lift(settings)
        for f in fields(self):
            if f.name in settings:
                value = settings.pop(f.name)
            else:
                value = f.default_factory() if f.default_factory is not MISSING else f.default
            setattr(self, f.name, value)
        if settings:
            raise TypeError(f"ModelConfig got an unexpected keyword argument {next(iter(settings))!r}")
        self.__post_init__()

    def __post_init__(self) -> None:
        if isinstance(self.layers, (list, tuple)) and self.layers:
            self.n_layers = len(self.layers)  # the list is the stack: its length is the depth


# Keys of the whole model, not of a slot: a hybrid's slot mapping cannot set them.
WHOLE_MODEL_KEYS = ("d_model", "n_layers", "layers", "attn_every", "attn", "pos_emb", "tie_embeddings", "form")
# The deepest stack the harness builds, far past any model it trains (a thousand layers fit a
# memory cap): a bound on model.n_layers and on the layers a stack label may count, checked
# before anything is made per layer (a list of 10^9 slot configs would be made before the
# memory check could refuse it).
MAX_LAYERS = 10_000
# A label names the run directory (outputs/<task>-<label>/...): past this many characters it is
# cut and tagged with a digest of the whole (dir_label), so a directory name always fits.
DIR_LABEL_CHARS = 96


def is_hybrid(cfg: ModelConfig) -> bool:
    return cfg.layers is not None or cfg.attn_every is not None


def _slot_spec(spec: Any, where: str) -> dict:
    """A slot as {"name": ..., overrides...}: a name, or a mapping with a name."""
    if isinstance(spec, str):
        return {"name": spec}
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        return dict(spec)
    checks.fail(where, "a mixer name or a mapping {name: <mixer>, <model key>: <value>, ...}", spec)


def check_depth(n_layers: Any) -> None:
    """model.n_layers: a positive integer, at most MAX_LAYERS (before anything is made per layer)."""
    checks.integer("model.n_layers", n_layers)
    if n_layers > MAX_LAYERS:
        checks.fail("model.n_layers", f"at most {MAX_LAYERS:,} (the deepest stack the harness builds)", n_layers)


def _check_layer_list(layers: Any) -> None:
    if not isinstance(layers, (list, tuple)) or not layers:
        checks.fail("model.layers", "a non-empty list of mixers, one per layer", layers)
    if len(layers) > MAX_LAYERS:
        checks.fail("model.layers", f"a list of at most {MAX_LAYERS:,} mixers", f"{len(layers):,} of them")


def slot_specs(cfg: ModelConfig) -> list[dict]:
    """One {"name": ..., overrides} per layer of a hybrid (model.layers, or model.attn_every)."""
    if cfg.layers is not None:
        _check_layer_list(cfg.layers)
        return [_slot_spec(spec, f"model.layers[{i}]") for i, spec in enumerate(cfg.layers)]
    k = cfg.attn_every
    checks.integer("model.attn_every", k)
    check_depth(cfg.n_layers)  # before a list of that many
    attn = _slot_spec(cfg.attn, "model.attn")
    return [attn if (i + 1) % k == 0 else {"name": cfg.name} for i in range(cfg.n_layers)]


def layer_configs(cfg: ModelConfig) -> list[ModelConfig]:
    """The ModelConfig each layer's block is built from: `cfg` itself in every layer of a plain
    model; in a hybrid, cfg with the slot's mixer and overrides (model.options only in outside
    slots). One place derives a slot's settings: the build, validation and accounting read it."""
    if not is_hybrid(cfg):
        check_depth(cfg.n_layers)
        return [cfg] * cfg.n_layers
    out = []
    builtin_options = registry.option_owners()
    for i, spec in enumerate(slot_specs(cfg)):
        over = lift(spec)  # a slot's old keys ({name: swa, window: 16}) are its options
        name = over.pop("name")
        where = f"model.layers[{i}]" if cfg.layers is not None else "model.attn"
        for key in over:
            if key in WHOLE_MODEL_KEYS or key not in ModelConfig.__dataclass_fields__:
                raise ValueError(f"{where}.{key}: not a setting of one layer (a slot may set any model.* key "
                                 f"but {', '.join(WHOLE_MODEL_KEYS)}, and its options)")
        own = over.pop("options", None)
        if registry.is_dotted(name):  # an outside slot: its own options, else the model's
            options = own if own is not None else cfg.options
        else:  # a built-in slot: the model's built-in settings, under its own
            shared = {k: v for k, v in dict(cfg.options or {}).items() if k in builtin_options}
            options = {**shared, **dict(own or {})}
        slot = replace(cfg, name=name, layers=None, attn_every=None, attn=registry.DEFAULT_ATTENTION, **over)
        slot.options = options if options is not None else {}
        out.append(slot)
    return out


def label(cfg: ModelConfig) -> str:
    """The model's name as runs and results show it: model.name, or a hybrid's slots in order
    with repeats counted (gated_deltanet*3+softmax)."""
    if not is_hybrid(cfg):
        return cfg.name
    return stack_label([slot.name for slot in layer_configs(cfg)])


def stack_label(names: list[str]) -> str:
    """Mixer names of consecutive layers, repeats counted: gated_deltanet*3+softmax."""
    runs: list[list] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return "+".join(name if n == 1 else f"{name}*{n}" for name, n in runs)


def stack_slots(text: str) -> list[str]:
    """The mixer of each layer of a label (stack_label's inverse): gated_deltanet*3+softmax ->
    [gated_deltanet, gated_deltanet, gated_deltanet, softmax]. A label is data (results.json
    holds it), so its counts are checked before a list is made of them: ValueError (one line) for
    an empty name, a count that is not a positive integer, or more than MAX_LAYERS layers in all."""
    parts = [part.partition("*") for part in str(text).split("+")]
    counts = []
    for name, star, count in parts:
        if not name or (star and not (count.isascii() and count.isdigit() and int(count) > 0)):
            shown = f"{name}{star}{count}"
            raise ValueError(f"model label {text[:80]!r} is no stack: {shown[:40]!r} is not <mixer> or "
                             "<mixer>*<count>")
        counts.append(int(count) if star else 1)
    if sum(counts) > MAX_LAYERS:
        raise ValueError(f"model label {text[:80]!r} counts {sum(counts):,} layers, more than any stack "
                         f"(model.n_layers is at most {MAX_LAYERS:,})")
    return [name for (name, _, _), n in zip(parts, counts) for _ in range(n)]


def dir_label(cfg: ModelConfig) -> str:
    """label(cfg) as a run directory's name takes it: whole up to DIR_LABEL_CHARS characters, else
    its start and a digest of the whole (two long stacks keep two directories)."""
    import hashlib

    text = label(cfg)
    if len(text) <= DIR_LABEL_CHARS:
        return text
    tail = f"...{len(layer_configs(cfg))}-layers-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    return text[:DIR_LABEL_CHARS - len(tail)] + tail


def validate(cfg: ModelConfig) -> None:
    """Raise ValueError with one line naming the `model.<field>` at fault if cfg cannot build a
    model; a hybrid's slots each as a model of their own, the message naming the slot."""
    if is_hybrid(cfg):
        return validate_hybrid(cfg)
    registry.resolve(cfg.name)  # a known name or an importable class, else one line
    if not isinstance(cfg.options, Mapping):
        checks.fail("model.options", "a mapping of settings (model.options.<name>=<value>)", cfg.options)
    check_depth(cfg.n_layers)
    for field_name in ("d_model", "n_heads", "mlp_ratio", "conv_size", "chunk_size"):
        checks.integer(f"model.{field_name}", getattr(cfg, field_name))
    checks.integer("model.qk_dim", cfg.qk_dim, nullable=True)
    if cfg.d_model % cfg.n_heads:
        checks.fail("model.n_heads", f"a divisor of model.d_model={cfg.d_model}", cfg.n_heads)
    checks.choice("model.form", cfg.form, FORMS)
    checks.choice("model.norm", cfg.norm, NORMS)
    checks.choice("model.pos_emb", cfg.pos_emb, POS_EMBS, nullable=True)
    for field_name in ("short_conv", "tie_embeddings", "mlp"):
        checks.boolean(f"model.{field_name}", getattr(cfg, field_name))
    checks.boolean("model.rotary", cfg.rotary, nullable=True)
    checks.number("model.dropout", cfg.dropout, "[0, 1)")
    if not registry.is_dotted(cfg.name):
        registry.check_options(cfg)  # a built-in's own settings, by its typed Options
    check_mixer = getattr(registry.resolve(cfg.name), "check_config", None)
    if check_mixer is not None:  # what only this mixer requires of the config
        check_mixer(cfg)
    d_qk = qk_width(cfg)
    checks.require(not (cfg.rotary and d_qk % 2),
                   f"model.rotary=true needs an even q/k width (model.qk_dim, or "
                   f"model.d_model/model.n_heads), got {d_qk}")


def validate_hybrid(cfg: ModelConfig) -> None:
    if cfg.layers is not None and cfg.attn_every is not None:
        raise ValueError("model.layers and model.attn_every: set one (the list, or its short form)")
    if cfg.layers is not None:
        _check_layer_list(cfg.layers)  # an empty list is no stack, whatever model.n_layers says
    checks.integer("model.attn_every", cfg.attn_every, nullable=True)
    check_depth(cfg.n_layers)
    if cfg.attn_every is not None and cfg.attn_every > cfg.n_layers:
        checks.fail("model.attn_every", f"at most model.n_layers={cfg.n_layers} (else no layer is attention)",
                    cfg.attn_every)
    if cfg.layers is not None and cfg.n_layers != len(cfg.layers):
        checks.fail("model.n_layers", f"{len(cfg.layers)}, the length of model.layers (or unset)", cfg.n_layers)
    slots = layer_configs(cfg)
    owners = registry.option_owners()
    stray = [key for key in (cfg.options or {}) if key not in owners]
    if stray and not any(registry.is_dotted(slot.name) for slot in slots):
        raise ValueError(f"model.options.{stray[0]}: no layer of this stack takes it (no built-in mixer has "
                         "that option, and no layer is an outside mixer)")
    for i, slot in enumerate(slots):
        where = f"model.layers[{i}]" if cfg.layers is not None else f"layer {i}"
        try:
            validate(slot)
        except ValueError as exc:
            raise ValueError(f"{where} ({slot.name}): {exc}") from None


def check_mixers(stack: Stack, lengths=None) -> None:
    """The pre-flight (registry.check_mixer) of every distinct slot of the stack, at each length."""
    seen = set()
    for slot in stack.slots:
        key = (slot.name, repr(dict(slot.options or {})))
        if key not in seen:
            seen.add(key)
            registry.check_mixer(slot, lengths)


def mixer_output(out) -> torch.Tensor:
    """A mixer's forward result as a tensor: layers written for other libraries return a tuple
    whose first element is the output (fla's (o, attn, cache))."""
    return out[0] if isinstance(out, tuple) else out


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x)); with model.mlp=false
    the mixer alone (Zoology's MQAR models: its recall is then the mixer's, not an MLP's)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm1 = make_norm(cfg.norm, cfg.d_model)
        self.mixer = registry.build(cfg, layer_idx)
        self.norm2 = make_norm(cfg.norm, cfg.d_model) if cfg.mlp else None
        self.mlp = MLP(cfg.d_model, cfg.mlp_ratio, cfg.dropout) if cfg.mlp else None
        self.dropout = nn.Dropout(cfg.dropout)
        # hook_mixer_out: the mixer's output (B, T, C) before the residual add, for any mixer
        # (an outside one too): ablating a whole layer edits it
        self.hook_mixer_out, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        x = self.hook_resid_mid(x + self.dropout(self.hook_mixer_out(mixer_output(self.mixer(self.norm1(x))))))
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return self.hook_resid_post(x)


class LanguageModel(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, max_seq_len: int, *, checked: bool = False) -> None:
        """``checked``: cfg has passed `validate` already (a run's plan checks it once, before
        anything is built), so it is not checked again here."""
        super().__init__()
        if not checked:
            validate(cfg)
        if vocab_size <= 0 or max_seq_len <= 0:
            raise ValueError(f"vocab_size and max_seq_len must be positive, got {vocab_size}, {max_seq_len}")
        self.cfg, self.vocab_size, self.max_seq_len = cfg, vocab_size, max_seq_len
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        stack = stack_of(cfg)
        self.pos_embed = nn.Embedding(max_seq_len, cfg.d_model) if stack.learned_positions else None
        self.dropout = nn.Dropout(cfg.dropout)
        # hook_embed: the residual entering block 0 (token and position embeddings): what an
        # interchange intervention restores at layer 0's input (harness.measure.intervene)
        self.hook_embed = HookPoint()
        self.layers = nn.ModuleList([Block(slot, i) for i, slot in enumerate(stack.slots)])
        self.norm_f = make_norm(cfg.norm, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        # A tied head reads unit-variance embeddings: rescale (as T5 does) to O(1) logits.
        self.logit_scale = cfg.d_model**-0.5 if cfg.tie_embeddings else 1.0

        # The recipe's init for every part but an outside mixer, which keeps its own.
        outside = {id(m) for mixer in self.mixers() if not getattr(mixer, "init_by_model", False)
                   for m in mixer.modules()}
        for module in self.modules():
            if id(module) not in outside:
                self._init_weights(module)
        nn.init.normal_(self.embed.weight, mean=0.0, std=1.0)  # a tied head was visited last
        for mixer in self.mixers():
            if hasattr(mixer, "reset_decay_parameters") and id(mixer) not in outside:
                mixer.reset_decay_parameters()
        for name, hook in self.named_modules():
            if isinstance(hook, HookPoint):
                hook.name = name

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """Unit-variance token and position embeddings, Xavier-uniform projections.

        On MQAR this matters more than any other choice here: with GPT-2's N(0, 0.02) the
        positions are nearly indistinguishable at the start and a 2-layer softmax model sits
        on the 1/N plateau for thousands of steps; with unit-variance embeddings it forms the
        induction circuit within a few hundred. The tied head is rescaled by d_model^-1/2
        (as in T5) so that unit-variance embeddings still give unit-scale initial logits; an
        untied head (the default: tying delays the induction circuit on MQAR) is Xavier-uniform.
        """
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=1.0)

    def forward(self, input_ids: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits (B, T, V) of input_ids (B, T); with ``positions`` (B, K) long, the logits at
        those positions only, (B, K, V): the final norm and the head (a V x C product per
        position) then run where a task has labels, so a large vocabulary costs in proportion
        to the labelled positions, not to T."""
        T = input_ids.shape[1]
        if T > self.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.max_seq_len}")
        x = self.embed(input_ids)  # (B, T, C)
        if self.pos_embed is not None:
            x = x + self.pos_embed.weight[:T]
        x = self.hook_embed(self.dropout(x))
        for block in self.layers:
            x = block(x)
        if positions is not None:
            x = x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # (B, K, C)
        return self.head(self.norm_f(x) * self.logit_scale)  # (B, T, V) or (B, K, V)

    # ---------------------------------------------------------------------------------------
    # Introspection used by measurement, cost accounting and results.

    def mixers(self) -> list[nn.Module]:
        return [block.mixer for block in self.layers]

    @property
    def d_key(self) -> Optional[int]:
        """Key dimension of one head's state in layer 0: d_qk (d_head unless model.qk_dim), m for
        favor, 1 + d_qk + d_qk^2 for taylor; None for a mixer that declares none. A hybrid's
        layers each have their own (layer_memory)."""
        return member(self.layers[0].mixer, "d_key")

    @property
    def d_head(self) -> int:
        """Width of one head's value read-out in layer 0, by the mixer's own count (layer_memory)."""
        found = layer_memory(self.layers[0].mixer, self.cfg.d_model, self.max_seq_len)["d_head"]
        return found or self.cfg.d_model // self.cfg.n_heads

    def state_size(self, sequence_length: Optional[int] = None) -> Optional[int]:
        """Elements every layer keeps to decode the next token, at `sequence_length` (default
        max_seq_len: what a KV cache holds there), summed over layers; None when a mixer
        declares no state_size."""
        n = self.max_seq_len if sequence_length is None else sequence_length
        sizes = [state_size(mixer, n) for mixer in self.mixers()]
        return None if None in sizes else sum(sizes)

    def memory(self, sequence_length: Optional[int] = None) -> dict[str, Any]:
        """Decoding memory at `sequence_length` (default max_seq_len), by its two parts: the
        fixed recurrent state and the attention layers' KV cache (which grows with length), in
        elements per layer and head (each layer by its own head count) and in total. "layers":
        one lay_memory row per layer; "state_elements" / "kv_cache_elements": the totals of
        each kind (None when a layer of that kind declares no state_size)."""
        n = self.max_seq_len if sequence_length is None else sequence_length
        rows = [{"layer": i, **layer_memory(mixer, self.cfg.d_model, n)} for i, mixer in enumerate(self.mixers())]
        out: dict[str, Any] = {"sequence_length": n, "layers": rows}
        for kind in ("state", "kv_cache"):
            mine = [r["elements"] for r in rows if r["kind"] == kind]
            out[f"{kind}_elements"] = None if None in mine else sum(mine)
        out["unknown_layers"] = [r["layer"] for r in rows if r["kind"] is None]
        return out

    def construction(self) -> list[dict[str, Any]]:
        """How each layer's mixer was built (registry.construction): its name, the constructor
        arguments the harness passed and the model.* keys that did not apply."""
        return [{"layer": i, **registry.built_with(mixer)} for i, mixer in enumerate(self.mixers())]

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (a tied head counted once); optionally without the embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if non_embedding else n

    def set_form(self, form: str) -> "LanguageModel":
        """Switch the computation form of every linear-family mixer (same parameters)."""
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; valid: {', '.join(FORMS)}")
        self.cfg = replace(self.cfg, form=form)
        for mixer in self.mixers():
            if hasattr(mixer, "form"):
                mixer.form = form
        return self

