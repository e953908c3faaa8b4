"""Tuning core, below the stages: trial records, the search's identity, oracles,
the hypermodel, the one tuner that chief, worker and single process build, the
reports of a search, and the final round.

`tuner.py`, `oracles.py` and `hypermodel.py` import keras-tuner / Keras at the
top: `stages/tune.py` imports them inside `run`, so `tfmlops --help` stays light.
Nothing here imports `tfmlops.stages`.
"""
