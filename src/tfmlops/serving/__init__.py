"""Everything a client runs: the exported formats and the served model.

Only export's modules (`signatures`, `formats`, `skew`) use TensorFlow; the served model
(`predictor`, `preprocess`, `pyfunc_model`) never imports it.
"""
