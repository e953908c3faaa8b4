"""Training core, below the stages: datasets, the compiled model, op determinism, `fit`
(one machine or several workers), test-split evaluation, reports and plots.

`stages/train.py` and tune's final round (`tuning/final_round.py`) train through it.
Nothing here imports `tfmlops.stages`.
"""
