"""Hydra's joblib launcher with grouped training (harness.run.grouped): the `processes` launcher.

A Hydra launcher has to live in the hydra_plugins namespace to be found; what it does is in
harness.run.grouped. Its settings are joblib's and three more: ``group`` (false: every job alone,
as joblib's own launcher), ``max_group`` and ``group_max_width``.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, configure_log, setup_globals
from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

from harness.run.grouped import GROUP_MAX_WIDTH, MAX_GROUP

@dataclass
class GroupedLauncherConf(JobLibLauncherConf):
    _target_: str = "hydra_plugins.harness_launcher.grouped_launcher.GroupedLauncher"
    group: bool = True                       # train the jobs that share a shape as one batched model
    max_group: int = MAX_GROUP               # members per group, at most (memory bounds it too)
    group_max_width: Optional[int] = GROUP_MAX_WIDTH  # on a CPU, wider models train alone (null: no limit)


ConfigStore.instance().store(group="hydra/launcher", name="grouped", node=GroupedLauncherConf,
                             provider="recall-harness")


class GroupedLauncher(JoblibLauncher):
    # the defaults are the config node's (Hydra passes the composed values; these serve a direct call)
    def __init__(self, group: bool = GroupedLauncherConf.group, max_group: int = GroupedLauncherConf.max_group,
                 group_max_width: Optional[int] = GroupedLauncherConf.group_max_width, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group, self.max_group, self.group_max_width = bool(group), int(max_group), group_max_width

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from joblib import Parallel, delayed

        from harness.run.grouped import describe, execute_unit, plan_units

        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        joblib_cfg = dict(self.joblib)
        joblib_cfg["backend"] = "loky"  # as joblib's launcher: the threading backend does not suit Hydra
        process_joblib_cfg(joblib_cfg)
        n_jobs = int(joblib_cfg.get("n_jobs") or 1)
        if self.group and len(job_overrides) > 1:
            # each job's config is composed here once more (about 0.2-0.4 s a job on a CPU)
            print(f"[harness] grouped training: composing {len(job_overrides)} jobs' configs to find the groups "
                  "(hydra.launcher.group=false skips this)", flush=True)
            units, alone = plan_units(self.config, self.hydra_context.config_loader, job_overrides, n_jobs,
                                      self.max_group, self.group_max_width)
            print("\n".join(describe(units, alone, n_jobs)), flush=True)
        else:
            units = [[i] for i in range(len(job_overrides))]
        from hydra.core.singleton import Singleton

        state = Singleton.get_state()
        done = Parallel(**joblib_cfg)(
            delayed(execute_unit)([initial_job_idx + i for i in unit], [job_overrides[i] for i in unit],
                                  self.hydra_context, self.config, self.task_function, state)
            for unit in units)
        returns: list[Optional[JobReturn]] = [None] * len(job_overrides)
        for unit, rets in zip(units, done):
            for i, ret in zip(unit, rets):
                returns[i] = ret
        return returns
