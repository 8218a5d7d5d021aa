"""Gather and aggregate heads, named by criteria fixed before the runs.

Bick, Xing & Gu (2025, "Understanding the skill gap in recurrent models: the role of the
Gather-and-Aggregate mechanism") find in-context retrieval done by two heads in turn, in
Transformers and in SSMs alike: a Gather head condenses a segment of the context into one token
of it, and an Aggregate head, at the position that needs the answer, reads the condensed token of
the right segment; each sits in few heads, and disabling one takes retrieval to chance. On
associative recall a segment is a key/value pair and its condensed token is the value token: a
G head binds the pair at the value token (it looks at the key just before), and an A head at the
query reads the bound value token. (With the short convolution the binding can be done by the
convolution instead, with no G head at all: the anatomy experiment runs an arm without it.)

The numbers every criterion reads are the rows harness.measure.ablate writes (mode=ablate, or a
run's own with trainer.ablate=true); the thresholds are the experiment's `analysis.*` keys,
written in harness/conf/experiment/anatomy.yaml and .../findings/anatomy.yaml before the runs
(THRESHOLDS holds the same defaults):

  necessary (both roles)  resample ablation of the head alone (its output taken from another
                          example of the batch) takes recall at least `ga_necessity` = 0.5 of the
                          way from the model's own recall to chance (1/N, a guess among the
                          example's values): (base - ablated) / (base - chance) >= 0.5.
                          Bick et al.'s own test: one head disabled, retrieval at chance.
  an A head               necessary; patching its clean output alone into the run whose query
                          was swapped restores at least `ga_restore` = 0.5 of the clean-minus-
                          corrupted logit difference; and at the query it puts at least
                          `ga_attention` = 0.5 of its weight on the answer's value token (its span
                          with the short convolution).
  a G head                necessary; at the value token of each queried pair it puts at least
                          `ga_attention` = 0.5 of its weight on the pair's key, the token before;
                          and its clean output, patched along its path into one A head of a later
                          layer alone (harness.measure.paths), restores at least `ga_restore` =
                          0.5 of the logit difference of the run whose keys were rotated.

Per run (seed), each head is judged on its own numbers. Heads are not matched across seeds (head
2 of one seed is no relative of head 2 of another), so what is compared across seeds is per model:
how many heads of each layer meet each role, and the numbers of each run's strongest candidates,
the A candidate (the head whose clean output restores the most of the query corruption) and the G
candidate (the head of an earlier layer whose path into the A candidate restores the most of the
key corruption). A model "has G&A" in a run where both candidates meet their criteria.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

THRESHOLDS = {"ga_necessity": 0.5, "ga_restore": 0.5, "ga_attention": 0.5}
RUN = "run_dir"
HEAD = [RUN, "layer", "head"]


@dataclass(frozen=True)
class Criteria:
    necessity: float = THRESHOLDS["ga_necessity"]
    restore: float = THRESHOLDS["ga_restore"]
    attention: float = THRESHOLDS["ga_attention"]

    @classmethod
    def of_runs(cls, runs: pd.DataFrame) -> "Criteria":
        """The thresholds the runs' experiment wrote (config.analysis.ga_*), else THRESHOLDS; a
        sweep whose runs disagree on one is refused (ValueError), not averaged."""
        found = {}
        for key, default in THRESHOLDS.items():
            column = f"config.analysis.{key}"
            values = set(runs[column].dropna()) if column in runs.columns else set()
            if len(values) > 1:
                raise ValueError(f"the runs disagree on {column}: {sorted(values)}")
            found[key] = float(values.pop()) if values else default
        return cls(found["ga_necessity"], found["ga_restore"], found["ga_attention"])


def necessity(rows: pd.DataFrame) -> pd.DataFrame:
    """Per head (run_dir, layer, head) and ablation kind: the share of the way to chance its
    ablation takes recall, (base - ablated) / (base - chance), as columns necessity_<kind>."""
    mine = rows[rows["kind"].isin(["zero", "mean", "resample"]) & rows["head"].notna()]
    span = (mine["base_accuracy"] - mine["chance"]).where(lambda s: s > 0)
    share = mine.assign(share=(mine["base_accuracy"] - mine["accuracy"]) / span)
    wide = share.pivot_table(index=HEAD, columns="kind", values="share", aggfunc="first")
    return wide.rename(columns=lambda k: f"necessity_{k}").reset_index()


def head_numbers(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per head of each run: necessity_<kind>, restore_<corruption> (its clean output
    patched in alone), value_on_key and query_on_answer (its weights), and the run's base recall
    and chance."""
    out = necessity(rows)
    patched = rows[rows["kind"] == "patch"].pivot_table(index=HEAD, columns="corrupt", values="restored",
                                                        aggfunc="first")
    out = out.merge(patched.rename(columns=lambda c: f"restore_{c}").reset_index(), on=HEAD, how="outer")
    weights = rows[rows["kind"] == "weights"]
    if not weights.empty:
        out = out.merge(weights[HEAD + ["value_on_key", "query_on_answer"]], on=HEAD, how="left")
    base = rows[rows["kind"].isin(["zero", "mean", "resample"])].groupby(RUN)[["base_accuracy", "chance"]].first()
    return out.merge(base.reset_index(), on=RUN, how="left")


def path_numbers(rows: pd.DataFrame, corrupt: str = "key") -> pd.DataFrame:
    """The path rows of one corruption: run_dir, sender_layer, sender_head, layer, head, restored."""
    paths = rows[(rows["kind"] == "path") & (rows["corrupt"] == corrupt)]
    return paths[[RUN, "sender_layer", "sender_head", "layer", "head", "restored"]].reset_index(drop=True)


def _at_least(values: pd.Series, threshold: float) -> pd.Series:
    return values.fillna(-np.inf) >= threshold


def roles(heads: pd.DataFrame, paths: pd.DataFrame, criteria: Criteria) -> pd.DataFrame:
    """head_numbers with is_A, is_G (the criteria above) and best_path (the most a path from the
    head into an A head of a later layer restores of the key corruption; NaN: no such A head)."""
    heads = heads.copy()
    needed = _at_least(heads.get("necessity_resample", pd.Series(np.nan, index=heads.index)), criteria.necessity)
    heads["is_A"] = (needed & _at_least(heads.get("restore_query", pd.Series(np.nan, index=heads.index)),
                                        criteria.restore)
                     & _at_least(heads.get("query_on_answer", pd.Series(np.nan, index=heads.index)), criteria.attention))
    a_heads = heads.loc[heads["is_A"], HEAD]
    into_a = paths.merge(a_heads, on=HEAD, how="inner")
    best = into_a.groupby([RUN, "sender_layer", "sender_head"])["restored"].max().rename("best_path").reset_index()
    heads = heads.merge(best.rename(columns={"sender_layer": "layer", "sender_head": "head"}), on=HEAD, how="left")
    heads["is_G"] = (needed & _at_least(heads.get("value_on_key", pd.Series(np.nan, index=heads.index)),
                                        criteria.attention) & _at_least(heads["best_path"], criteria.restore))
    return heads


def candidates(heads: pd.DataFrame, paths: pd.DataFrame) -> pd.DataFrame:
    """Per run: its A candidate (the head whose clean output restores the most of the query
    corruption) and G candidate (the earlier head whose path into the A candidate restores the
    most of the key corruption; none when the A candidate sits in layer 0), each with its numbers,
    and ga (both meet their roles: roles() columns is_A, is_G must be present)."""
    out = []
    for run, mine in heads.groupby(RUN, sort=False):
        a = mine.sort_values("restore_query", ascending=False, na_position="last").iloc[0]
        into = paths[(paths[RUN] == run) & (paths["layer"] == a["layer"]) & (paths["head"] == a["head"])]
        row = {RUN: run, "A_layer": a["layer"], "A_head": a["head"], "A_is": bool(a["is_A"]),
               **{f"A_{k}": a.get(k, np.nan) for k in _NUMBERS}}
        if into.empty:
            row.update({"G_layer": np.nan, "G_head": np.nan, "G_is": False, "G_path": np.nan,
                        **{f"G_{k}": np.nan for k in _NUMBERS}})
        else:
            best = into.sort_values("restored", ascending=False).iloc[0]
            g = mine[(mine["layer"] == best["sender_layer"]) & (mine["head"] == best["sender_head"])].iloc[0]
            row.update({"G_layer": g["layer"], "G_head": g["head"], "G_is": bool(g["is_G"]),
                        "G_path": best["restored"], **{f"G_{k}": g.get(k, np.nan) for k in _NUMBERS}})
        row["ga"] = row["A_is"] and row["G_is"]
        out.append(row)
    return pd.DataFrame(out)


# the numbers of a head the criteria (and the figure) read
_NUMBERS = ("necessity_resample", "necessity_zero", "necessity_mean", "restore_query", "restore_key",
            "restore_value", "value_on_key", "query_on_answer")
