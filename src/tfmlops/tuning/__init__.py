"""Tuning core, below the stages: trial records, the search's identity, oracles,
the hypermodel, the one tuner that chief, worker and single process build, the
reports of a search, and the final round.

`tuner.py`, `oracles.py` and `hypermodel.py` import keras-tuner / Keras at the
top: `stages/tune.py` imports them inside `run`, so `tfmlops --help` stays light.
Nothing here imports `tfmlops.stages`.

The search: hyperband (default), bayesian or random over `model/search_space.py`,
every trial built by the shared builder, fed by the project's tf.data pipeline and
run under op determinism (with the seed: the same trials score the same). Past
`budget_minutes` of wall clock the running trial stops at its epoch's end and no
new one starts; the log, `reports/tune.json` (`budget_exhausted`) and
best_hparams.yaml's header say so (the result then depends on the machine's
speed). keras-tuner's state lives in `paths.tuner/<tuner>-<key>` (`search_key`):
rerunning resumes a killed or budget-stopped search without redoing finished
trials. The first trial of a fresh search is the params' own settings when they
lie in the space (`oracles.BaselineMixin`), so the search's best scores at least
what they score.

MLflow: the stage's run is the parent; each trial is a nested child run (status
FAILED when the trial failed; the search goes on). On the chief the runs are kept
by the tracking sidecar (tracking/sidecar.py): tune's process never imports MLflow
or matplotlib (the plots are drawn there).

Distributed search (keras-tuner's own mode, KERASTUNER_TUNER_ID /
KERASTUNER_ORACLE_IP / KERASTUNER_ORACLE_PORT): the chief ("chief" in the
tuner id) serves the oracle, owns the parent run (tagged with the search key)
and writes every output; each worker finds that open run by its tags
(tracking.attach_run) and nests its trials under it, writing no output.
"""
