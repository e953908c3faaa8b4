"""How `train` fits a model, on one machine (Keras 3) or across workers (tf_keras):
the batches, the compiled model, op determinism, precision, fine-tuning phases, the
callbacks, and the backup folder a killed run resumes from. Functions that touch Keras
take the keras module (as model/builder.py does), so both paths are this code.

Keras 3's `fit` fails under a MultiWorkerMirroredStrategy spanning several workers
(keras-team/keras#20585, open; Keras 3.15.1, TF 2.21: "PerReplica ... to a Tensor");
tf_keras' `fit` runs the same strategy and is importable beside Keras 3. Where the
multi-worker path differs, and why (`Setup.across_workers`):
- `train.optimizer.name: lamb` is refused (tf_keras has no Lamb) and
  `train.jit_compile: auto` means tf_keras' default (no XLA);
- every worker passes the same `paths.backup` to tf_keras' BackupAndRestore and
  ModelCheckpoint: the chief writes there (`chief/` TF checkpoints, `best.weights.h5`),
  each other worker to its own `workertemp_<task>` folder, which it deletes (saving
  involves collective ops, so all workers save). `paths.backup` must be on a
  filesystem every worker sees; a non-chief's history and traces go to its scratch;
- one phase, the whole backbone trainable (fine-tuning is not built for it);
- after `fit` no collective op is left: other workers stop, the chief copies the
  weights into the Keras 3 twin (`model_to_save`) and saves what one machine saves.

The backup folder a killed run resumes from: model/backup.py.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfmlops import profiling, tracking
from tfmlops.config import Config
from tfmlops.errors import ConfigError, DataError
from tfmlops.model.backup import (
    Resume,
    adopt_backup,
    backup_fingerprint,
    finished_epochs,
    history_rows,
)
from tfmlops.model.fitting import (
    BEST_WEIGHTS,
    Folders,
    Phase,
    best_val_loss,
    built_model,
    compiled_model,
    datasets,
    fit_in_phases,
    phases,
    recorder_class,
    steps,
    training_callbacks,
)

log = logging.getLogger(__name__)

TF_KERAS_OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")


# ------------------------------------------------------------ the run's setup

@dataclass(frozen=True)
class Setup:
    keras: Any  # Keras 3, or tf_keras across several workers
    strategy: Any
    placement: dict  # model/strategy.strategy_placement
    global_batch: int
    chief: bool
    across_workers: bool  # MultiWorkerMirroredStrategy over more than one worker (tf_keras)


def set_up(cfg: Config, merged: Config, prepared) -> Setup:
    """The strategy (before any other TensorFlow op: logical CPUs and collective ops
    cannot be set up later in a process) and the keras module that fits under it."""
    from tfmlops.stages.train import strategy as dist

    tf_config = os.environ.get("TF_CONFIG")
    kind = dist.resolve_strategy(merged.train.strategy, tf_config, dist.visible_gpus())
    # one worker fits in Keras 3; several in tf_keras (the module docstring says why)
    across = kind == "multi_worker" and dist.cluster_tasks(tf_config) > 1
    if across:
        tracking.preflight(cfg)  # the chief's store is away: fail now, before any worker waits
        if merged.train.optimizer.name not in TF_KERAS_OPTIMIZERS:
            raise ConfigError(
                f"train.optimizer.name: {merged.train.optimizer.name} is not available in "
                f"tf_keras, which multi-worker training uses; use one of "
                f"{', '.join(TF_KERAS_OPTIMIZERS)}")
        import tf_keras as keras
    else:
        import keras
    dist.prepare_devices(kind, merged.train.replicas)
    strategy = dist.make_strategy(kind, merged.train.replicas)
    placement = dist.strategy_placement(strategy, kind)
    global_batch = merged.train.batch_size * placement["replicas"]
    if global_batch > prepared.counts["train"]:
        raise DataError(
            f"train.batch_size {merged.train.batch_size} x {placement['replicas']} replica(s) = "
            f"{global_batch} is more than the {prepared.counts['train']} train images; lower "
            "train.batch_size (or train.overrides / tune's batch_size)")
    return Setup(keras, strategy, placement, global_batch, tracking.is_chief(), across)



def folders(cfg: Config, merged: Config, setup: Setup, profile: Path,
            scratch: Path | None) -> Folders:
    """The chief adopts the backup in paths.backup (one made with other params or data is
    discarded); other workers (tf_keras, which redirects their writes) pass it too, with
    history and traces in their scratch folder."""
    backup = Path(cfg.paths.backup)
    if scratch is not None:
        (scratch / "history").mkdir(parents=True)
        return Folders(backup, scratch / "tb", scratch / "history")
    adopt_backup(backup, backup_fingerprint(merged, setup.keras), setup.keras)
    return Folders(backup, profile, backup)


def resume(cfg: Config, merged: Config, setup: Setup, where: Folders) -> Resume:
    done = finished_epochs(where.backup, setup.keras)
    if done and setup.chief:
        log.info(f"train: resuming after epoch {done} of {merged.train.epochs} from the "
                 f"backup in {cfg.paths.backup}")

    def rows(folder: Path) -> list[dict]:
        return [r for r in history_rows(folder) if r["epoch"] <= done]

    # The checkpoint's threshold comes from the shared backup's rows, the same on every
    # worker: one that saves the best weights when the chief does not waits in a
    # collective the chief never joins.
    return Resume(done, rows(where.history), best_val_loss(rows(where.backup)))



# ------------------------------------------------------------- fit

@dataclass(frozen=True)
class Fitted:
    """What `fit` made: the model (in the setup's keras), its history and fit time."""

    model: Any
    rows: list  # every epoch's row, a resumed run's included
    seconds: float
    adopted_from: str | None = None  # tune's final-round run whose fit this is (adopt.py)


@dataclass(frozen=True)
class Training:
    """What every step of one train run reads, passed whole: the merged params (paths and
    profiling included), the prepared data, the strategy's setup, this worker's folders,
    what a killed run left, and the stage's MLflow run."""

    merged: Config
    prepared: Any
    setup: Setup
    folders: Folders
    resumed: Resume
    run: Any


def fit(t: Training, policy: str) -> Fitted:
    """Build (in the strategy's scope), then fit in phases under `policy`."""
    from tfmlops.model import precision
    from tfmlops.progress import keras_verbose

    merged, prepared, setup, where, resumed, run = (t.merged, t.prepared, t.setup,
                                                        t.folders, t.resumed, t.run)
    keras = setup.keras
    train_ds, _, steps_per_epoch = data = datasets(merged, prepared, setup.global_batch)
    plan = phases(merged)
    resolved = {}
    if setup.across_workers:
        resolved["auto_shard_policy"] = _shard_policy(train_ds)
        log.info(f"train: {task_name(setup.strategy)} of {setup.placement['workers']} "
                 f"workers, {setup.strategy.num_replicas_in_sync} replicas, global batch "
                 f"{setup.global_batch}, auto-shard {resolved['auto_shard_policy']}")
        if len(plan) > 1:  # not built for tf_keras fit across workers
            log.warning("train: train.fine_tune is ignored across workers: one phase, the "
                        "whole backbone trainable")
        plan = [Phase(1, 0, merged.train.epochs, None)]
    with precision.global_policy(policy, keras):
        with setup.strategy.scope():
            # compiled once here for the checks below; each phase recompiles in the scope
            model = compiled_model(merged, prepared, keras, steps_per_epoch * merged.train.epochs)
        scaled = precision.uses_loss_scaling(model, keras)
        if policy == "mixed_float16" and not scaled:
            raise RuntimeError("mixed_float16 without a LossScaleOptimizer: float16 gradients "
                               "would underflow")
        run.log_params({"resolved": {"jit_compile": bool(model.jit_compile),
                                     "loss_scaling": scaled, "fine_tune_phases": len(plan),
                                     **resolved}})
        recorder = recorder_class(keras)(where.history, prepared.counts["train"], run,
                                          resumed.rows)

        def callbacks(phase: Phase) -> list:
            recorder.phase = phase.number if len(plan) > 1 else None
            return training_callbacks(
                keras, merged.train, where, profiling.keras_profile_batch(merged, steps_per_epoch),
                recorder, resumed.best_so_far if setup.across_workers
                else best_val_loss(recorder.rows))

        started = time.perf_counter()
        with setup.strategy.scope():  # each phase compiles: its optimizer's variables here
            fit_in_phases(model, merged, prepared, keras, data, plan, callbacks,
                          keras_verbose() if setup.chief else 0, resumed.done)
        return Fitted(model, recorder.rows, time.perf_counter() - started)


def model_to_save(t: Training, fitted: Fitted):
    """The Keras 3 model to save, with the weights of the epoch with the lowest val_loss.

    Across workers the tf_keras weights pass through a tf_keras model outside the
    strategy, so loading `best.weights.h5` (tf_keras' h5 layout) touches no distributed
    variable; the Keras 3 twin's optimizer is fresh (later stages never resume training).
    Reading the weights all-reduces (BatchNorm statistics): every worker calls this.
    """
    merged, prepared, setup = t.merged, t.prepared, t.setup
    if fitted.adopted_from is not None:  # the kept model holds its best epoch's weights
        return fitted.model
    best = t.folders.backup / BEST_WEIGHTS
    if not setup.across_workers:
        if best.is_file():
            fitted.model.load_weights(best)
        return fitted.model
    import keras
    import tf_keras

    weights = fitted.model.get_weights()
    if not setup.chief:
        return None  # no collective op is left: the chief finishes alone
    local = built_model(merged, prepared, tf_keras, pretrained=False)
    local.set_weights(weights)
    if best.is_file():
        local.load_weights(best)
    twin = compiled_model(merged, prepared, keras,
                          steps(prepared, setup.global_batch) * merged.train.epochs,
                          pretrained=False)  # it receives the trained weights
    twin.set_weights(local.get_weights())
    # Built (zero slots), so loading the saved file finds the optimizer variables it expects.
    twin.optimizer.build(twin.trainable_variables)
    return twin


def _shard_policy(ds) -> str:
    """The auto-shard policy the fed dataset carries; refuse any but an explicit one."""
    policy = ds.options().experimental_distribute.auto_shard_policy
    if policy.name not in ("DATA", "FILE"):
        raise RuntimeError(f"the train dataset's auto-shard policy is {policy.name}; "
                           "data/pipeline.dataset must set DATA or FILE explicitly")
    return policy.name


def task_name(strategy) -> str:
    resolver = strategy.cluster_resolver
    return f"{resolver.task_type}:{resolver.task_id}"
