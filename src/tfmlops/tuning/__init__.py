"""Tuning core, below the stages: trial records, the search's identity, oracles,
the hypermodel, the one tuner that chief, worker and single process build, the
reports of a search, and the final round.

`tuner.py`, `oracles.py` and `hypermodel.py` import keras-tuner / Keras at the
top: `stages/tune.py` imports them inside `run`, so `tfmlops --help` stays light.
Nothing here imports `tfmlops.stages`.

The search: hyperband (default), bayesian or random over the space of
`model/search_space.py`, every trial built by the shared builder and fed by the
project's tf.data pipeline, with early stopping, under TensorFlow's op determinism
(with the seed: the same trials score the same). Budgets: `max_trials` (any
tuner), `max_epochs` per trial, and `budget_minutes` of wall clock, a guard the
default params do not reach: past it the running trial stops at its epoch's end,
no new trial starts, the best so far is kept, and the log, `reports/tune.json`
(`budget_exhausted`) and best_hparams.yaml's header say the search was cut short
(its result then depends on the machine's speed). keras-tuner's state lives in
`paths.tuner/<tuner>-<key>`, the key hashing everything a trial depends on (space,
tuner, seed, fixed settings, data version): rerunning resumes a killed or budget-stopped search without
redoing finished trials; changing the space starts a fresh one.

Baseline: the first trial of a fresh search (any tuner, distributed too) is
the params' own model and optimizer settings when they all lie in the space
(else one line says which key does not), so the search's best scores at least
what the params' own settings score in it. Its child run is tagged
`tfmlops.tune.baseline=true`; the trials CSV has a `baseline` column.

Final round (`tune.final_candidates`, tuning/final_round.py): the params' own
settings and the search's best trials are trained exactly as `train` trains
them; a challenger must beat the params' settings to become the tuned
configuration.

MLflow: the stage's run is the parent; each trial is a nested child run with
its hyperparameters as params, per-epoch metrics, and status FAILED when the
trial failed (the search goes on). The parent logs the best values and score,
the trials CSV, plots, and a TensorFlow Profiler trace of the first trial run.
On the chief the run and its nested runs are kept by the tracking sidecar
(tracking/sidecar.py): tune's process never imports MLflow or matplotlib (the
plots are drawn there).

Distributed search (keras-tuner's own mode, KERASTUNER_TUNER_ID /
KERASTUNER_ORACLE_IP / KERASTUNER_ORACLE_PORT): the chief ("chief" in the
tuner id) serves the oracle, owns the parent run (tagged with the search key)
and writes every output; each worker finds that open run by its tags
(tracking.attach_run) and nests its trials under it, writing no output.
"""
