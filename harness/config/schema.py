"""Structured configuration: one dataclass per swappable part, registered with Hydra.

Every group in `conf/` has a schema here, so an unknown key, a wrong type or an unknown
choice fails at composition time, before any training starts. The YAML files in `conf/`
hold only values; the schemas hold the names and the types.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from harness.model import ModelConfig
from harness.tasks import TASKS, get_task


@dataclass
class TrainerConfig:
    max_steps: int = 1500
    lr: float = 3e-3
    batch_size: int = 64
    weight_decay: float = 0.1
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1          # cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_examples: int = 256           # held-out examples per evaluation setting
    eval_tokens: int = 16384           # tokens per evaluation forward pass (examples per pass = this // length)
    target_accuracy: Optional[float] = 0.99   # early stop once every setting reaches it
    # plateau stop: after `patience` validation evaluations in a row without improvement (None: never).
    # An evaluation improves when val accuracy > best + min_delta, or val loss < best loss - 0.01 nats:
    # the loss clause keeps a run going through the first plateau, where every mixer sits near
    # zero accuracy for hundreds of steps before it escapes.
    patience: Optional[int] = None
    min_delta: float = 0.0
    min_steps: int = 0                 # never stopped at a plateau before this step
    device: str = "auto"               # auto | cpu | cuda | cuda:N
    threads: Optional[int] = None      # CPU threads of this run; None: torch's default (all cores)
    precision: str = "fp32"            # fp32 | bf16 (autocast on CUDA/CPU)
    compile: bool = False              # torch.compile the model
    data_chunk: int = 16               # training batches generated per vectorised call
    log_every: int = 25                # progress-bar refresh (the only host sync in the loop)
    progress: bool = True
    checkpoint: bool = True            # keep the final weights as model.pt
    ckpt_every: Optional[int] = 500    # resumable checkpoint every this many steps (None: never)
    resume: Optional[str] = None       # a run directory to continue from its last checkpoint
    measure: bool = True               # mechanistic measurements at the end of training
    measure_examples: int = 64
    # interchange interventions at the end of training (harness.measure.intervene) on
    # measure_examples test examples at the training length: results.json's intervene and mechanism
    intervene: bool = False
    # ablation, patching and path patching at the end of training, with the ablate.* settings
    # (harness.measure.ablate.ablate_run): the rows mode=ablate writes, in this run's results.json
    ablate: bool = False
    # every initial weight w becomes w (1 + init_jitter z), z ~ N(0, 1) from a stream of its own: a
    # run and its twin at 1e-6 differ by what another CPU's rounding makes of one run, so where
    # they end apart the run's number depends on the machine (the rate pilots: analysis.lr_edge)
    init_jitter: float = 0.0


@dataclass
class LoggerConfig:
    name: str = "wandb"                # wandb | none
    project: str = "recall-harness"
    entity: Optional[str] = None
    mode: str = "offline"              # offline (no network) | online | disabled
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)


@dataclass
class ProbeConfig:
    d: list[int] = field(default_factory=lambda: [32, 64, 128])
    n: Optional[list[int]] = None      # None: powers of two from d/2 to 64d (at most 16,384)
    candidates: int = 1024
    max_queries: int = 1024            # softmax only: its read-out is O(N^2) per query set
    seed: int = 0


@dataclass
class CostConfig:
    seq_lens: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    forms: list[str] = field(default_factory=lambda: ["parallel", "chunk", "recurrent"])
    batch_size: int = 2
    n_heads: int = 4
    head_dim: int = 64
    repeats: int = 3
    recurrent_max_len: int = 1024      # the token loop is slow on CPU; skip it beyond this


# The ablations and the corruptions harness.measure.ablate knows (named in every row it writes).
ABLATIONS = ("zero", "mean", "resample")
CORRUPTIONS = ("query", "key", "value")
PATH_CORRUPTIONS = ("key",)  # path patching's: a gather head's work is undone by moving a key


@dataclass
class AblateConfig:
    run: Optional[str] = None          # mode=ablate: the trained run's directory
    examples: int = 256                # examples of the run's first test setting (and as many for mean ablation)
    kinds: list[str] = field(default_factory=lambda: list(ABLATIONS))
    patch: bool = True                 # activation patching of each head (clean into corrupted examples)
    corrupt: list[str] = field(default_factory=lambda: list(CORRUPTIONS))  # the corruptions patched
    path_corrupt: list[str] = field(default_factory=lambda: list(PATH_CORRUPTIONS))  # path patching ([]: none)
    seed: int = 1_000_003              # the batches' seed, apart from training's and evaluation's
    trust_code: bool = False           # allow a run whose config names outside code (harness.load_run)


@dataclass
class InterveneConfig:
    run: Optional[str] = None          # mode=intervene: the trained run's directory
    examples: int = 256                # examples of the run's first test setting
    seed: int = 1_000_003              # the batch's and the replacement tokens' seed, apart from training's
    trust_code: bool = False           # allow a run whose config names outside code (harness.load_run)


@dataclass
class SweepConfig:
    skip_completed: bool = True        # a rerun skips runs whose results.json matches the config
    fail_on_error: bool = False        # in a sweep, record a failure and go on (summary at the end)
    max_jobs: int = 100_000            # a larger grid is refused before any work (harness.run.precheck)


@dataclass
class Config:
    mode: str = "train"                # train | probe | cost | ablate | intervene
    seed: int = 0
    task: Any = MISSING
    model: ModelConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    ablate: AblateConfig = field(default_factory=AblateConfig)
    intervene: InterveneConfig = field(default_factory=InterveneConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    out_dir: Optional[str] = None      # None = the Hydra run directory
    # what an experiment fixes for its figures before its runs (a tolerance a law is held to, the
    # predictions it is held to: analysis.law_predictions, rows written by analysis.preregister);
    # training never reads them, the figures read them from each run's config
    analysis: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mode:
    """What a mode runs, as dotted paths (imported when a run of that mode starts:
    harness.run.job). `run(plan, out_dir)`: the mode's work, its results returned (training also
    takes `resume=`, the checkpoint it continues from). `ready(plan) -> plan`, when set: what the
    mode checks or reads before its run directory is claimed, a refusal in one line (the memory a
    training run or a probe grid needs, against the device; the trained run a derived mode reads)."""
    run: str
    ready: Optional[str] = None


# Every mode, the one list of them (validation checks `mode` against it). cost checks nothing up
# front: each measured call that would not fit is skipped and recorded (harness.bench.run).
MODES = {"train": Mode("harness.train.loop.train", ready="harness.train.memory.fitted"),
         "probe": Mode("harness.run.probe_mode.probe_run", ready="harness.run.probe_mode.fits"),
         "cost": Mode("harness.run.cost_mode.cost_run"),
         "ablate": Mode("harness.run.ablate_mode.ablate_mode", ready="harness.outputs.source.derive"),
         "intervene": Mode("harness.run.intervene_mode.intervene_mode", ready="harness.outputs.source.derive")}


def task_schema(name: str) -> type:
    """The task's own Config dataclass with a `name` field added (the group choice)."""
    base = get_task(name).Config
    return dataclasses.make_dataclass(
        f"{base.__name__}Schema", [("name", str, field(default=name))], bases=(base,)
    )


def register_task(name: str) -> None:
    """Make an outside task module a choice of the task group: `task=package.module`."""
    ConfigStore.instance().store(group="task", name=name, node=task_schema(name))


def model_label(model) -> str:
    """`${model_label:${model}}`: the model's name as run directories show it (a hybrid's slots,
    gated_deltanet*3+softmax, harness.model.label; a long one cut to a name a file system takes,
    harness.model.dir_label); model.name where the config cannot say more (validation reports
    what is wrong with it, once, later)."""
    from omegaconf import OmegaConf

    from harness.model import dir_label

    try:
        return dir_label(ModelConfig(**OmegaConf.to_container(model, resolve=True)))
    except Exception:  # any bad value: the plan's validation names it in one line
        return str(model.get("name"))


def times(*factors) -> int:
    """`${times:${model.qk_dim},${analysis.pairs_per_key}}`: the product, a whole number (a grid
    whose N is a multiple of the key width: the findings capacity experiment)."""
    product = math.prod(float(f) for f in factors)
    if not float(product).is_integer():
        raise ValueError(f"${{times:...}} of {', '.join(map(str, factors))} is {product}, not a whole number")
    return int(product)


def register() -> None:
    from omegaconf import OmegaConf

    from harness.config.mixers import register_resolver

    register_resolver()
    if not OmegaConf.has_resolver("model_label"):
        OmegaConf.register_new_resolver("model_label", model_label)
    if not OmegaConf.has_resolver("times"):
        OmegaConf.register_new_resolver("times", times)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for name in TASKS:
        cs.store(group="task", name=f"{name}_schema", node=task_schema(name))
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
