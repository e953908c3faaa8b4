"""Model compression shared by the `prune` and `quantize` stages.

Pure helpers (no TensorFlow): `measure` (sparsity tables, gzip sizes),
`frontier` (variant rows, the edge pick). TensorFlow/tfmot helpers, imported
only by those two stages (they run with TF_USE_LEGACY_KERAS=1): `source` (the
trained and pruned models in tf_keras), `pruning` (and its schedule's steps,
which need no TensorFlow), `tflite`, `conversion` (with QAT), `litert` (running
a .tflite), `plot`.
"""
