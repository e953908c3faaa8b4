"""Training core, below the stages. `fit.py`: datasets, the compiled model, op
determinism, precision, callbacks, the backup folder and `fit` (one machine in Keras 3,
or tf_keras across workers: the same functions); `results.py`: test-split evaluation,
reports, plots and the stage's metrics.

`stages/train.py` and tune's final round (`tuning/final_round.py`) train through it.
Nothing here imports `tfmlops.stages`.
"""
