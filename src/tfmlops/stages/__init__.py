"""One module per DVC stage, each with a `run(cfg) -> metrics` core."""
