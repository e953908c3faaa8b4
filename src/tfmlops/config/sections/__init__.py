"""The sections of params.yaml as frozen msgspec Structs, one module per section.

Each class owns its keys: their types, their defaults, their numeric ranges
(`Meta` bounds), their choices (`Literal`) and the rules that span several of
its keys (its `_rules`, run by `__post_init__`); `root.Config` holds them all and
the rules across sections. `tfmlops.config.replace` re-validates; assignment
raises AttributeError. Nothing here imports TensorFlow, MLflow or pydantic.
"""
