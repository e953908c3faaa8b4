"""Where a Python process's seconds go, measured from outside the code under test.

Put on PYTHONPATH by benchmarks/stage_costs.py (Python imports `sitecustomize` from
it at start-up) with STAGE_COSTS_DIR set; elsewhere it does nothing. It works on any
revision of the project, old ones included, since it changes none of their code.

In every Python process but DVC's own: a daemon thread samples the main thread's
stack every 5 ms (sys._current_frames) and files the interval since the last sample
under the first rule that matches the stack (module docstring of stage_costs.py has
the rules); at exit the process writes one JSON file: its argv, pid and parent, its
start (from /proc), when Python reached this file ("start" is the time before), when it
exited, and the seconds per category. (Its CPU cost: benchmarks/stage_costs.py.)
"""

from __future__ import annotations

import os
import sys

_OUT = os.environ.get("STAGE_COSTS_DIR")


def _process_start() -> float | None:
    """The process's start on CLOCK_BOOTTIME (/proc's starttime is in clock ticks since boot)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# (category, test on one frame's filename and function name). For each sample: "imports"
# if any frame is importing; else the first category of the outermost frame that matches
# any rule (the outer call owns what it calls: a model saved by mlflow's log_model is MLflow).
_SP = os.sep + "site-packages" + os.sep


def _rules():
    def lib(name):
        part = _SP + name + os.sep
        return lambda f, fn: part in f

    def pkg(path):
        part = os.sep + "tfmlops" + os.sep + path
        return lambda f, fn: part in f

    def func(path_part, *names):
        return lambda f, fn: path_part in f and fn in names

    return [
        ("evaluation", func(_SP + "mlflow" + os.sep + "pyfunc", "predict")),
        ("mlflow", lib("mlflow")),
        ("mlflow", pkg("tracking" + os.sep)),
        ("conversion", lib("tf2onnx")),
        ("conversion", func(os.sep + "lite" + os.sep, "convert")),
        ("conversion", func("keras", "export")),
        ("conversion", func("saved_model", "save")),
        ("fit", func("keras", "fit")),
        ("evaluation", func("keras", "predict", "evaluate", "predict_on_batch")),
        ("evaluation", lib("onnxruntime")),
        ("evaluation", func("interpreter", "invoke")),
        ("evaluation", pkg("evaluation")),
        ("evaluation", pkg("runtimes")),
        ("writing", func("keras", "save", "save_weights", "save_model")),
        ("writing", lib("h5py")),
        ("writing", pkg("files.py")),
        ("writing", lib("matplotlib")),
        ("data", pkg("data" + os.sep)),
        ("data", lib("PIL")),
        ("data", func("tensorflow" + os.sep + "python" + os.sep + "data", "__iter__", "__next__")),
    ]


def _category(frame, rules, memo) -> str:
    """The sample's category; an import's is `imports:<top-level package being loaded>`
    (the innermost module being imported: TensorFlow's numpy import is numpy's)."""
    chain = []
    while frame is not None:
        chain.append(frame)
        frame = frame.f_back
    found = "other"
    for fr in chain:  # innermost first: the last match is the outermost
        code = fr.f_code
        f = code.co_filename
        if f.startswith("<frozen importlib"):
            loading = next((c.f_locals.get("name") for c in chain
                            if c.f_code.co_name == "_find_and_load"), None)
            return f"imports:{str(loading).split('.')[0]}"
        key = (f, code.co_name)
        hit = memo.get(key)
        if hit is None:
            hit = next((cat for cat, test in rules if test(f, code.co_name)), "")
            memo[key] = hit
        if hit:
            found = hit
    return found


def _start() -> None:
    import atexit
    import json
    import threading
    import time

    boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    started = _process_start()
    main_id = threading.get_ident()
    seconds: dict[str, float] = {}
    rules, memo = _rules(), {}
    state = {"last": time.perf_counter(), "stop": False}

    def sample() -> None:
        while not state["stop"]:
            time.sleep(0.005)
            frame = sys._current_frames().get(main_id)
            now = time.perf_counter()
            if frame is None:
                continue
            cat = _category(frame, rules, memo)
            seconds[cat] = seconds.get(cat, 0.0) + now - state["last"]
            state["last"] = now

    def write() -> None:
        state["stop"] = True
        end = time.clock_gettime(time.CLOCK_BOOTTIME)
        record = {"argv": sys.argv, "pid": os.getpid(), "ppid": os.getppid(),
                  "started": started, "site": boot, "ended": end,
                  "start_s": None if started is None else round(boot - started, 3),
                  "seconds": {k: round(v, 3) for k, v in sorted(seconds.items())}}
        path = os.path.join(_OUT, f"{os.getpid()}-{time.time_ns()}.json")
        with open(path, "w") as f:
            json.dump(record, f)

    threading.Thread(target=sample, name="stage-costs-sampler", daemon=True).start()
    atexit.register(write)


def _wanted() -> bool:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return bool(_OUT) and argv0 not in ("dvc", "git")


if _wanted():
    _start()
