"""One package per DVC stage, `stages/<name>/`: its `SPEC` (tfmlops.stage_spec), its
`run(cfg) -> metrics`, and every module only that stage uses (and `doctor`, the CLI's
check of a machine, which runs three of them in a temporary folder). Shared libraries
sit below (`data/`, `model/`, `compress/`, `serving/`, `tracking/`, `config/`); none of
them imports a stage.
"""
