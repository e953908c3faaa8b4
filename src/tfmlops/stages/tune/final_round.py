"""tune's final round: the finalists trained at `train`'s length, and the winner.

The search ranks trials after a few epochs, but `train` trains for
`train.epochs`; a configuration that learns fast is not always the one that
ends best. So the params' own settings and the search's best
`tune.final_candidates` trials are each trained exactly as `train` trains
them, and a challenger wins only by beating the params' settings on
`tune.objective`. The table is `paths.tuned/final_round.csv`; each fit is a
nested MLflow run `final-<name>`. Each finalist's fit is kept as train keeps its own
(final_fit.py), and the winner's goes to `paths.tuned/fit/` for train to adopt.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.model import hparams
from tfmlops.stages.tune import final_fit, search_space
from tfmlops.stages.tune.search import TrialRecord, last_line

log = logging.getLogger(__name__)

COLUMNS = ("candidate", "trial", "score", "val_loss", "epochs", "best_epoch", "seconds", "error")


@dataclass
class FinalEntry:
    """One configuration of the final round, trained the way `train` trains it."""

    name: str  # "params" (the params' own settings) or "trial-<id>"
    config: Config
    trial_id: str | None = None
    score: float | None = None  # the objective at the epoch train keeps (lowest val_loss)
    val_loss: float | None = None
    epochs: int | None = None
    best_epoch: int | None = None
    seconds: float | None = None
    error: str | None = None
    val_examples: int | None = None  # how many validation images the score counts


def train_finalists(cfg: Config, parent: tracking.StageRun, trials: list[TrialRecord],
        best: TrialRecord) -> list[FinalEntry] | None:
    """Train the finalists as `train` does on one device (train.overrides merged; its
    datasets, build, compile, precision, seed, op determinism, early stopping on
    val_loss; the epoch of the lowest val_loss is the one kept), each a nested run
    `final-<name>`. A candidate over `tune.max_model_params` fails, as in the search."""
    n = cfg.tune.final_candidates
    if n == 0 or not cfg.train.use_tuned:  # train would not read the winner
        return None
    from tfmlops.data import pipeline

    prepared = pipeline.load_prepared(cfg)
    n_val = prepared.counts["val"]
    entries = [FinalEntry("params", cfg, val_examples=n_val)] + [
        FinalEntry(f"trial-{t.trial_id}", search_space.config_from_values(cfg, t.values),
                   t.trial_id, val_examples=n_val) for t in finalists(cfg, trials, best, n)]
    log.info(f"tune: final round: {', '.join(e.name for e in entries)} at train's "
             f"{cfg.train.epochs} epochs")
    final_fit.forget_others(cfg, [e.name for e in entries])
    for entry in entries:
        child = parent.start_child(f"final-{entry.name}", tags={
            "tfmlops.tune.round": "final", "tfmlops.tune.candidate": entry.name})
        tree = hparams.tuned_tree(entry.config)
        child.log_params(tree)
        started = time.perf_counter()
        try:
            merged, _ = hparams.merge(cfg, tree)  # what train builds: params <- it <- overrides
            rows = final_fit.fit_as_train(merged, prepared, child, cfg.tune.max_model_params,
                                          final_fit.finalist_dir(cfg, entry.name))
            # the epoch train keeps: the first lowest val_loss (ModelCheckpoint's strict `<`)
            kept = min(range(len(rows)), key=lambda i: rows[i]["val_loss"])
            entry.score = float(rows[kept][cfg.tune.objective])
            entry.val_loss = float(rows[kept]["val_loss"])
            entry.epochs, entry.best_epoch = len(rows), rows[kept]["epoch"]  # 1-based, as train's
        except Exception as exc:  # noqa: BLE001 - a finalist that fails is recorded, not fatal
            entry.error = last_line(f"{type(exc).__name__}: {exc}")
        entry.seconds = round(time.perf_counter() - started, 2)
        if entry.error is None and math.isfinite(entry.score):
            child.log_metrics({"score": entry.score, "best_epoch": entry.best_epoch,
                               "seconds": entry.seconds})
            child.end("FINISHED")
        else:
            child.set_tags({"tfmlops.tune.error": entry.error or "non-finite score"})
            child.end("FAILED")
    return entries


def finalists(cfg: Config, trials: list[TrialRecord], best: TrialRecord,
               n: int) -> list[TrialRecord]:
    """The challengers: of the search's best `n` distinct configurations, those that are
    not the params' own.

    When the search itself ranks the params' own settings among its best `n`, they take
    that place and no trial ranked below them is trained again: such a trial could only
    win the round by beating at train's length what beat it at the search's. The round
    exists for the opposite case, a trial that beat the params' settings by learning
    fast; it is trained at full length to see whether its lead holds.
    """
    own = search_space.baseline(cfg)[0]
    sign = cfg.tune.sign
    done = [t for t in trials if t.status == "COMPLETED" and t.score is not None
            and math.isfinite(t.score)]
    done.sort(key=lambda t: (t is not best, -sign * t.score, int(t.trial_id)))
    picked, seen = [], []
    for t in done:
        values = {k: t.values[k] for k in search_space.HP_NAMES if k in t.values}
        if values in seen:  # hyperband's later rounds repeat values
            continue
        seen.append(values)
        if values != own:
            picked.append(t)
        if len(seen) == n:
            break
    return picked


def pick_winner(cfg: Config, entries: list[FinalEntry]) -> FinalEntry:
    """The params' own settings unless a challenger beats them by more than the noise.

    A validation split moves accuracy in steps of one image (one of 281 is 0.36
    points), and a fresh clone's search once won by exactly one image and then
    scored lower on test. So a challenger replaces the params' settings only when
    it is better on the objective by more than one validation image's worth (an
    accuracy-like objective: at least two images more right) AND not worse on
    val_loss. A loss objective is continuous: lower, and not worse on val_loss.
    Between challengers, a tie on the objective goes to the lower val_loss.
    """
    sign = cfg.tune.sign
    scored = [e for e in entries if e.error is None and e.score is not None
              and math.isfinite(e.score)]
    if not scored:
        raise RuntimeError(f"tune: every finalist failed; the first: {entries[0].error}")
    champion = entries[0] if entries[0] in scored else None
    challengers = [e for e in scored if e is not champion]
    best = max(challengers, key=lambda e: (sign * e.score, -e.val_loss), default=None)
    if champion is None or (best is not None and beats_beyond_noise(best, champion, sign)):
        return best
    return champion


def beats_beyond_noise(challenger: FinalEntry, champion: FinalEntry, sign: int) -> bool:
    """`challenger` is better than `champion` by more than one validation example."""
    if challenger.val_loss > champion.val_loss:
        return False
    gain = sign * (challenger.score - champion.score)
    if sign < 0 or not challenger.val_examples:  # a loss, or no count: any gain
        return gain > 0
    return round(gain * challenger.val_examples) >= 2  # whole images, not float noise


def final_round_rows(entries: list[FinalEntry]) -> list[dict[str, Any]]:
    return [{"candidate": e.name, "trial": e.trial_id, **{k: getattr(e, k) for k in COLUMNS[2:]}}
            for e in entries]


def final_round_metrics(entries: list[FinalEntry] | None, winner: FinalEntry | None) -> dict:
    if not entries:
        return {}
    params = entries[0]
    out = {
        "final_winner_score": round(winner.score, 6),
        "final_winner_is_params": int(winner is params),
        "final_seconds": round(sum(e.seconds or 0 for e in entries), 2),
    }
    if params.score is not None:
        out["final_params_score"] = round(params.score, 6)
    return out

