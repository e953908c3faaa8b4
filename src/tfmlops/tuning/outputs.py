"""What the tune stage writes and says: best_hparams.yaml's text, precision decisions
passed on to train, and the summary line."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import yaml

from tfmlops.config import Config
from tfmlops.model import hparams
from tfmlops.tuning import final_round
from tfmlops.tuning.records import TrialRecord
from tfmlops.tuning.search import project_name

log = logging.getLogger(__name__)


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
    from tfmlops.training.fit import PRECISION_CACHE

    decisions = Path(cfg.paths.tuner) / PRECISION_CACHE
    if decisions.is_file():
        shutil.copyfile(decisions, out / PRECISION_CACHE)


def header(text: str) -> str:
    return (f"# {text}\n"
            "# train merges: params.yaml <- this file (train.use_tuned) <- train.overrides\n")
