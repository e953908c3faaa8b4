"""One of N processes logging to one tracking store at once (run by test_sqlite_concurrency).

usage: python concurrent_writer.py PARAMS INDEX STEPS START_FILE

It loads MLflow, says it is ready, waits for START_FILE so that all writers hit
the store together, then logs STEPS metric batches through tracking.stage_run,
the path every stage takes.
"""

import sys
import time
from pathlib import Path

from tfmlops import tracking
from tfmlops.config import load_config


def main(params: str, index: int, steps: int, start_file: Path) -> None:
    cfg = load_config(params)
    tracking.import_mlflow()  # the slow import, before the start line
    print("ready", flush=True)
    while not start_file.exists():
        time.sleep(0.01)
    out = Path(cfg.paths.reports) / "writers" / str(index)
    with tracking.stage_run(cfg, "concurrency", out, params={"writer": index}) as run:
        for step in range(steps):
            run.log_metrics({"value": step, "writer": index}, step=step)
    print(f"errors={len(run.errors)} queued={run.queued}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
