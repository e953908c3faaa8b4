"""One module per DVC stage, each with a `run(cfg) -> metrics` core (and `doctor`, the
CLI's check of a machine, which runs three of them in a temporary folder)."""
