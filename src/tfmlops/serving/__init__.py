"""Everything a client runs: the exported formats and the served model.

- `signatures`: the TensorFlow Serving SavedModel (image bytes or floats in,
  probabilities and label out; decoding and preprocessing in the graph).
- `formats`: builds, reloads, parity-checks and measures every format for `export`.
- `skew`: how closely each served path reproduces the Keras model (parity).
- `preprocess`: the same preprocessing in NumPy/PIL, for runtimes without
  TensorFlow (ONNX Runtime, LiteRT) in the served model.
- `predictor` + `pyfunc_model`: the MLflow pyfunc model `mlflow models serve`
  loads from code (no pickle), running the fastest runtime that passed parity.
- `registration`: the model card and the registered version's tags.

Only `signatures` and `formats` use TensorFlow; the served model never imports it.
"""
