"""What a search reports: its best trial, metrics, the trials table and plots,
best_hparams.yaml's text, precision decisions passed on to train, and the summary line."""

from __future__ import annotations

import itertools
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import yaml

from tfmlops import tracking
from tfmlops.artifacts import PRECISION
from tfmlops.config import Config
from tfmlops.config.sections.tune import objective_direction
from tfmlops.model import hparams
from tfmlops.stages.tune import final_round, search_space
from tfmlops.stages.tune.search import SearchResult, TrialRecord, last_line, project_name

log = logging.getLogger(__name__)

# stopped_at_epoch: the pruner stopped the trial after that epoch (empty: it ran its epochs)
FIXED_COLUMNS = ("trial", "baseline", "score", "status", "epochs", "best_epoch",
                 "stopped_at_epoch", "seconds")


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
        "trials_pruned": sum(t.stopped_at_epoch is not None for t in result.trials),
        "search_seconds": round(result.seconds, 2),
        "budget_exhausted": int(result.stop_reason == "budget"),
        "stopped_after_failures": int(result.stop_reason == "failures"),
    }


def columns() -> list[str]:
    return [*FIXED_COLUMNS, *search_space.HP_NAMES]


def trial_rows(cfg: Config, trials: list[TrialRecord]) -> list[dict[str, Any]]:
    return [{"trial": int(t.trial_id), "baseline": t.baseline, "score": t.score,
             "status": t.status, "epochs": t.values.get("tuner/epochs", cfg.tune.max_epochs),
             "best_epoch": t.best_epoch, "stopped_at_epoch": t.stopped_at_epoch,
             "seconds": t.seconds,
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


def log_summary(cfg: Config, metrics: dict, best: TrialRecord, best_cfg: Config,
                winner: final_round.FinalEntry | None) -> None:
    if metrics["budget_exhausted"]:
        log.warning(f"tune: the budget of {cfg.tune.budget_minutes:g} min cut the search short "
                    f"after {metrics['trials']} trials: its result depends on this machine's "
                    "speed; raise tune.budget_minutes for a reproducible search")
    chosen = (f"; final round at train's length: {winner.name} wins with "
              f"{cfg.tune.objective} {winner.score:.4f}" if winner else "")
    log.info(f"tune: best {cfg.tune.objective} {best.score:.4f} (trial {best.trial_id}) of "
             f"{metrics['trials']} trials ({metrics['trials_failed']} failed, "
             f"{metrics['trials_run']} run now) in {metrics['search_seconds']:.0f} s{chosen} -> "
             f"{hparams.best_path(cfg)}: {len(best_cfg.model.blocks)} blocks, "
             f"{best_cfg.train.optimizer.name} lr {best_cfg.train.optimizer.learning_rate:.2g}, "
             f"{best_cfg.train.schedule.name}, batch {best_cfg.train.batch_size}")


def best_text(cfg: Config, best: TrialRecord, key: str, chosen: Config,
              winner: final_round.FinalEntry | None, cut_short: bool) -> str:
    head = (f"best trial {best.trial_id} of search {project_name(cfg, key)}: "
            f"{cfg.tune.objective} {best.score:.6g}")
    if cut_short:
        head += (f"\n# cut short by tune.budget_minutes ({cfg.tune.budget_minutes:g}): "
                 "a faster or slower machine searches further or less far")
    if winner is not None:
        head += (f"\n# final round at train's length: {winner.name} wins "
                 f"({cfg.tune.objective} {winner.score:.6g})")
    return header(head) + yaml.safe_dump(hparams.tuned_tree(chosen), sort_keys=False)


def pass_on_precision(cfg: Config, out: Path) -> None:
    """The timed precision decisions (`timed`, a CPU with bf16 units) beside best_hparams.yaml:
    train reads the one of the architecture it trains, as the final round trained it."""
    decisions = Path(cfg.paths.tuner) / PRECISION
    if decisions.is_file():
        shutil.copyfile(decisions, out / PRECISION)


def header(text: str) -> str:
    return (f"# {text}\n"
            "# train merges: params.yaml <- this file (train.use_tuned) <- train.overrides\n")
