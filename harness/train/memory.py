"""Peak memory of a training run, estimated from the config before anything large is allocated.

A run holds, for its whole length, the parameters with their gradients and AdamW's two moments
(16 bytes a parameter in float32) and the held-out evaluation batches; a training step adds the
data chunk it was generated in and the activations kept for the backward pass; an evaluation
adds one forward pass over `chunk` examples without them. Per token and layer a pre-norm block
keeps its norms, q/k/v (before and after the short convolution and the feature map), the
mixer's read-out and the MLP's hidden layer; the mixer's core adds what its form forms at once
(harness.ops): an (c x c) block per chunk and a state per chunk boundary (chunk form; and the
decay masks that the fused CPU kernel keeps for learned scalar decays, one per decay head), the
(T x T) weights (parallel form), a state per token (recurrent form); softmax's fused kernel
forms no (T x T) matrix. The end-of-run measurements hold every mixer's hook tensors for
`measure_examples` examples at once (harness.measure.trained). The logits cost
three vocabulary-wide rows per token (logits, log-softmax, gradient).

The figures are deliberately a little high: tests/test_resources.py holds every built-in mixer
between the peak measured by harness.peak_memory and three times it. `check_training` refuses
in one line what cannot fit; `eval_chunk` streams evaluation in pieces that do.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from harness.config.build import model_config, task_config
from harness.devices import format_bytes, memory_limit, select_device
from harness.errors import ResourceError
from harness.layers.parts import qk_width
from harness.model import ModelConfig, Stack, is_hybrid, stack_of
from harness.train.evaluate import examples_per_pass

if TYPE_CHECKING:
    from harness.config.plan import RunPlan

FLOAT = 4                 # bytes: parameters, activations and logits are float32 (bf16 autocast: less)
TOKEN_DATA = 4 * 8 * 2    # bytes a token of a generated batch holds: 4 long tensors, as much again while made
HEADROOM = 256 * 2**20    # the interpreter, torch and the allocator's own slack


@dataclass(frozen=True)
class ModelFacts:
    """What the estimate needs to know of a model, read off its config and its mixer's class."""
    d_model: int
    n_layers: int
    n_heads: int
    d_qk: int          # per-head width of q and k
    d_key: int         # per-head key side of the state (feature maps change it)
    mlp_ratio: int     # the MLP's hidden width over d_model (0: no MLP, model.mlp=false)
    core: str          # harness.ops core of the mixer ("" when it declares none)
    form: str
    chunk: int
    vocab: int
    params: int
    # heads whose (c x c) decay masks the fused CPU chunk kernels keep for the backward pass: the
    # learned scalar decays' (DecayChunkCPU, DeltaChunkCPU with a decay); 0 for every other core
    kept_mask_heads: int = 0


def param_count(mcfg: ModelConfig, vocab: int, max_len: int, learned_positions: bool | None = None) -> int:
    """Parameters of the language model, counted from the config (nothing is built): embedding and
    head, learned positions (``learned_positions``, when the caller has its stack; else derived),
    and per block its norms, MLP (none with model.mlp=false) and the mixer's projections (q, k, v,
    output, a gate's worth more for the gated and decayed mixers, the short convolution)."""
    if learned_positions is None:
        learned_positions = stack_of(mcfg).learned_positions
    C, H, r = mcfg.d_model, mcfg.n_heads, mcfg.mlp_ratio
    qkv = 2 * H * qk_width(mcfg) + C
    mixer = C * qkv + 2 * C * C + (qkv * mcfg.conv_size if mcfg.short_conv else 0) + 4 * C
    mlp = 2 * r * C * C + (r + 1) * C + 2 * C if mcfg.mlp else 0  # its two layers and its norm
    block = mixer + mlp + 2 * C
    embed = vocab * C * (1 if mcfg.tie_embeddings else 2)
    positions = max_len * C if learned_positions else 0
    return embed + positions + mcfg.n_layers * block + 2 * C


def model_facts(mcfg: ModelConfig, stack: Stack, vocab: int, max_len: int) -> ModelFacts:
    """The estimate's facts; a hybrid's are those of its costliest slot at the longest length
    (every layer is then counted as that one: an estimate that errs high, never low)."""
    if not is_hybrid(mcfg):  # every layer is cfg: one layer's facts
        return slot_facts(mcfg, stack.mixers[0], vocab, max_len, stack.learned_positions)
    options = [slot_facts(slot, cls, vocab, max_len, stack.learned_positions)
               for slot, cls in zip(stack.slots, stack.mixers)]
    return max(options, key=lambda f: _block_elements(f, max_len, training=True))


def slot_facts(mcfg: ModelConfig, cls: type, vocab: int, max_len: int, learned_positions: bool) -> ModelFacts:
    """One layer's facts, its config and mixer class, counted as if every layer were it."""
    d_qk = qk_width(mcfg)
    key_width = getattr(cls, "key_width", None)
    d_key = int(key_width(d_qk, mcfg)) if callable(key_width) else d_qk
    core_for = getattr(cls, "core_for", None)
    core = core_for(mcfg) if callable(core_for) else getattr(cls, "core", "")
    core = core if isinstance(core, str) else ""
    kept_mask_heads = 0
    if core in ("decay_scalar", "delta_gated") and not getattr(cls, "fixed_decays", False):
        decay_heads = getattr(cls, "decay_heads_for", None)
        kept_mask_heads = mcfg.n_heads * (int(decay_heads(mcfg)) if callable(decay_heads) else 1)
    return ModelFacts(mcfg.d_model, mcfg.n_layers, mcfg.n_heads, d_qk, d_key, mcfg.mlp_ratio if mcfg.mlp else 0,
                      core, mcfg.form, mcfg.chunk_size, vocab, param_count(mcfg, vocab, max_len, learned_positions),
                      kept_mask_heads)


def _mixer_elements(f: ModelFacts, T: int, training: bool) -> float:
    """Elements per token one mixer's core forms at once (kept for the backward when training)."""
    H, m, dv = f.n_heads, f.d_key, f.d_model // f.n_heads
    per_dim = m if f.core == "decay_per_dim" else 1
    if f.core == "softmax":  # the fused kernel never forms the (T x T) weights (harness.ops.softmax)
        return (8.0 if training else 4.0) * H * dv
    if f.core == "":  # a mixer that declares no core: as much as a softmax, to be safe
        return 2.0 * H * T + 4.0 * f.d_model
    if f.form == "parallel":
        return (4.0 if training else 2.0) * H * T * per_dim
    if f.form == "recurrent":  # a state per token, kept for the backward pass
        return (1.0 if training else 0.0) * H * m * (dv + 1) + 4.0 * H * m
    c = min(f.chunk, T)  # the (c x c) block of a chunk; a per-dimension gate adds key-wide factors
    kept_masks = f.kept_mask_heads * (c + 1) / 2 if training else 0.0  # a lower triangle per chunk
    return 4.0 * H * c + (8.0 * H * m if per_dim > 1 else 0.0) + 2.0 * H * m * (dv + 1) / c + 4.0 * H * m + kept_masks


def _block_elements(f: ModelFacts, T: int, training: bool) -> float:
    """Elements per token one block holds: norms, q/k/v twice (projection, convolution), the
    feature-mapped q and k, read-out and output, the MLP's hidden layer twice (before and after
    the activation), the residual stream."""
    C, H = f.d_model, f.n_heads
    qkv = 2 * H * f.d_qk + C
    if training:
        dense = 2 * qkv + 2 * H * f.d_key + 6 * C + 2 * f.mlp_ratio * C
    else:  # no_grad: what one block has alive at its widest point
        dense = qkv + 2 * H * f.d_key + 2 * C + 2 * f.mlp_ratio * C
    return dense + _mixer_elements(f, T, training)


def activation_bytes(f: ModelFacts, batch: int, T: int, training: bool, logit_rows: int | None = None) -> float:
    """One forward pass over (batch, T) tokens: every block's activations when training (all are
    kept for the backward pass), one block's at a time when not; plus `logit_rows` vocabulary-wide
    rows per token (training: logits, log-softmax, gradient; evaluation: logits and the masked copy)."""
    tokens = batch * T
    blocks = f.n_layers if training else 1
    logits = (logit_rows if logit_rows is not None else 3 if training else 2) * f.vocab
    return FLOAT * tokens * (blocks * _block_elements(f, T, training) + logits + 4 * f.d_model)


def state_bytes(f: ModelFacts) -> float:
    """Parameters, gradients and AdamW's two moments."""
    return 4 * FLOAT * f.params


def eval_bytes(f: ModelFacts, lengths: list[int], tokens: int, examples: int) -> float:
    """Peak bytes of evaluating at every length in `lengths` (the held-out sets: `examples` each,
    their tokens held for the whole run), streamed `tokens` tokens per forward pass, beside a
    training run's parameters and optimizer state."""
    held = sum(examples * T * TOKEN_DATA / 2 for T in lengths)
    return state_bytes(f) + held + max(activation_bytes(f, examples_per_pass(T, tokens, examples), T, training=False)
                                       for T in lengths) + HEADROOM


def measure_bytes(f: ModelFacts, lengths: list[int], examples: int) -> float:
    """Peak bytes of the end-of-run measurements (harness.measure.trained.measure_model): the
    measurement streams MEASURE_TOKENS tokens per forward pass (at least one example), keeping
    every mixer's hook tensors (q and k before and after the feature map, v, the read-out) of one
    pass until its query rows are reduced, beside the run's state."""
    from harness.measure.trained import MEASURE_TOKENS

    H, dv = f.n_heads, f.d_model // f.n_heads
    hooks = f.n_layers * (2 * H * f.d_qk + 2 * H * f.d_key + 2 * H * dv + H)

    def one_pass(T: int) -> float:
        group = min(examples, max(1, MEASURE_TOKENS // T))  # examples per forward pass
        return activation_bytes(f, group, T, training=False, logit_rows=1) + 2 * FLOAT * group * T * hooks

    return state_bytes(f) + max(one_pass(T) for T in lengths) + HEADROOM


def train_bytes(f: ModelFacts, batch: int, T: int, data_chunk: int) -> float:
    """Peak bytes of a training step: state, the generated data chunk and the step's activations."""
    return state_bytes(f) + batch * data_chunk * T * TOKEN_DATA + activation_bytes(f, batch, T, True) + HEADROOM


@dataclass(frozen=True)
class RunShape:
    """The sizes of a training run that its memory depends on."""
    facts: ModelFacts
    train_len: int
    eval_lens: list[int]
    batch: int
    data_chunk: int
    eval_examples: int


def run_shape(cfg: DictConfig) -> RunShape:
    """cfg's sizes, from the config alone: nothing is generated (harness.tasks.train_length)."""
    module, tcfg = task_config(cfg.task)
    mcfg = model_config(cfg.model)
    return shape_of(mcfg, stack_of(mcfg), module, tcfg, cfg.trainer)


def shape_of(mcfg: ModelConfig, stack: Stack, module, tcfg, tr) -> RunShape:
    """The sizes of a run of this model (its config and stack) on this task (its module and
    Config) with trainer `tr`."""
    from harness.tasks import train_length

    train_len = train_length(module, tcfg)
    eval_lens = [train_length(module, s) for s in module.eval_settings(tcfg)]
    facts = model_facts(mcfg, stack, tcfg.vocab_size, module.max_seq_len(tcfg))
    return RunShape(facts, train_len, eval_lens, tr.batch_size, tr.data_chunk, tr.eval_examples)


def eval_tokens(shape: RunShape, tokens: int, limit: float) -> int:
    """The most tokens per evaluation pass, at most `tokens` (trainer.eval_tokens), whose peak fits
    in `limit`, halving; 0 when not even one example per pass fits."""
    while True:
        if max(eval_bytes(shape.facts, shape.eval_lens, tokens, shape.eval_examples),
               train_bytes(shape.facts, shape.batch, shape.train_len, shape.data_chunk)) <= limit:
            return tokens
        if tokens <= min(shape.eval_lens):  # one example per pass already
            return 0
        tokens //= 2


def check_training(cfg: DictConfig) -> int:
    """Refuse (ResourceError, one line) a training run whose step or evaluation cannot fit on its
    device; otherwise the tokens per evaluation pass that fit (trainer.eval_tokens, or fewer)."""
    return fit_training(run_shape(cfg), cfg.trainer, select_device(cfg.trainer.device))


def fitted(plan: RunPlan) -> RunPlan:
    """The training plan with the tokens per evaluation pass that fit on its device (ResourceError,
    one line, if its step or evaluation cannot fit)."""
    tr = plan.trainer
    tokens = fit_training(shape_of(plan.mcfg, plan.stack, plan.module, plan.tcfg, tr), tr, plan.device)
    return replace(plan, eval_tokens=tokens)


def fit_training(shape: RunShape, tr, device) -> int:
    """check_training of a run of this shape with trainer `tr` on `device`: every estimate made,
    then held against what the device holds (read once)."""
    f = shape.facts
    limit, where = memory_limit(device)
    step = train_bytes(f, shape.batch, shape.train_len, shape.data_chunk)
    tokens = eval_tokens(shape, tr.eval_tokens, limit)
    examples = min(tr.measure_examples, tr.eval_examples)
    measured = measure_bytes(f, shape.eval_lens, examples) if tr.measure else 0.0
    if step > limit:
        raise ResourceError(f"training: batch {tr.batch_size} x length {shape.train_len} x width {f.d_model} "
                            f"({f.n_layers} layers, {f.params:,} parameters, vocabulary {f.vocab}) needs about "
                            f"{format_bytes(step)}; {where} has {format_bytes(limit)}")
    if tokens == 0:
        need = eval_bytes(f, shape.eval_lens, 1, shape.eval_examples)
        raise ResourceError(f"evaluation: {tr.eval_examples} examples at length {max(shape.eval_lens)} "
                            f"needs about {format_bytes(need)} even one example at a time; "
                            f"{where} has {format_bytes(limit)}")
    if measured > limit:
        raise ResourceError(f"measurement: {examples} examples at length {max(shape.eval_lens)} needs about "
                            f"{format_bytes(measured)} (lower trainer.measure_examples, or set "
                            f"trainer.measure=false); {where} has {format_bytes(limit)}")
    return tokens


def total_bytes(cfg: DictConfig) -> float:
    """The run's estimated peak (training step or evaluation, whichever is larger)."""
    shape = run_shape(cfg)
    f = shape.facts
    return max(train_bytes(f, shape.batch, shape.train_len, shape.data_chunk),
               eval_bytes(f, shape.eval_lens, cfg.trainer.eval_tokens, shape.eval_examples))


__all__ = ["ModelFacts", "RunShape", "activation_bytes", "check_training", "eval_bytes", "eval_tokens",
           "fit_training", "fitted", "model_facts", "param_count", "run_shape", "shape_of",
           "total_bytes", "train_bytes"]
