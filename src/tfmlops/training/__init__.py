"""Training core, below the stages: `fit.py` fits (one machine in Keras 3, or tf_keras
across workers), `results.py` evaluates, reports and plots. `stages/train.py` and tune's
final round train through it; nothing here imports `tfmlops.stages`."""
