"""What a search reports: its best trial, metrics, the trials table and plots."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.config.sections.tune import objective_direction
from tfmlops.model import search_space
from tfmlops.tuning.records import SearchResult, TrialRecord, last_line

FIXED_COLUMNS = ("trial", "baseline", "score", "status", "epochs", "best_epoch", "seconds")


def best_trial(cfg: Config, trials: list[TrialRecord]) -> TrialRecord:
    done = [t for t in trials if t.status == "COMPLETED" and t.score is not None
            and math.isfinite(t.score)]
    if not done:
        failed = [t for t in trials if t.message]
        why = f"; the first failure: {last_line(failed[0].message)}" if failed else ""
        raise RuntimeError(f"tune: none of the {len(trials)} trials completed{why}")
    sign = cfg.tune.sign
    # best score; ties go to the earlier trial
    return max(done, key=lambda t: (sign * t.score, -int(t.trial_id)))


def search_metrics(result: SearchResult, best: TrialRecord) -> dict[str, Any]:
    statuses = [t.status for t in result.trials]
    return {
        "best_score": round(best.score, 6),
        "best_trial": int(best.trial_id),
        "best_learning_rate": best.values.get("learning_rate"),
        "trials": len(result.trials),
        "trials_completed": statuses.count("COMPLETED"),
        "trials_failed": statuses.count("FAILED") + statuses.count("INVALID"),
        "trials_run": len(result.ran_now),
        "search_seconds": round(result.seconds, 2),
        "budget_exhausted": int(result.stop_reason == "budget"),
        "stopped_after_failures": int(result.stop_reason == "failures"),
    }


def columns() -> list[str]:
    return [*FIXED_COLUMNS, *search_space.HP_NAMES]


def trial_rows(cfg: Config, trials: list[TrialRecord]) -> list[dict[str, Any]]:
    return [{"trial": int(t.trial_id), "baseline": t.baseline, "score": t.score,
             "status": t.status, "epochs": t.values.get("tuner/epochs", cfg.tune.max_epochs),
             "best_epoch": t.best_epoch, "seconds": t.seconds,
             **{k: t.values.get(k) for k in search_space.HP_NAMES}} for t in trials]


def log_plots(parent: tracking.StageRun, cfg: Config, rows: list[dict[str, Any]]) -> None:
    """Score per trial (with the best so far) and score against learning rate, as
    `plots/` of the run: drawn by its tracking sidecar (matplotlib is not imported here)."""
    parent.log_drawn(draw_plots, (cfg.tune.objective, cfg.tune.tuner, rows), "plots")


def draw_plots(objective: str, tuner: str, rows: list[dict[str, Any]], folder: Path) -> Path:
    """The two figures of `log_plots` as PNGs in `folder`."""
    from matplotlib.figure import Figure

    done = [r for r in rows if r["status"] == "COMPLETED" and r["score"] is not None]
    failed = [r for r in rows if r["status"] != "COMPLETED"]
    better = max if objective_direction(objective) == "max" else min
    best_so_far = list(itertools.accumulate((r["score"] for r in done), better))

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.scatter([r["trial"] for r in done], [r["score"] for r in done], label="trial")
    ax.step([r["trial"] for r in done], best_so_far, where="post", color="C1",
            label="best so far")
    for r in failed:
        ax.axvline(r["trial"], color="C3", alpha=0.3, linestyle=":")
    ax.set(xlabel="trial", ylabel=objective,
           title=f"{tuner}: score per trial" + (" (dotted: failed)" if failed else ""))
    ax.legend()
    fig.savefig(folder / "tune_score_per_trial.png")

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for i, schedule in enumerate(sorted({str(r["schedule"]) for r in done})):
        pts = [r for r in done if str(r["schedule"]) == schedule]
        ax.scatter([r["learning_rate"] for r in pts], [r["score"] for r in pts],
                   color=f"C{i}", label=schedule)
    ax.set_xscale("log")
    ax.set(xlabel="peak learning rate", ylabel=objective,
           title="score against learning rate, by schedule")
    ax.legend()
    fig.savefig(folder / "tune_score_vs_learning_rate.png")
    return folder
