"""`tfmlops <stage>`: a thin layer over each stage's `run(cfg)`.

TensorFlow and MLflow are imported only inside the stage that needs them, so
`--help` answers at once. A user error (bad params, bad data, tracking away)
prints one line and exits 2. Messages go to stderr through the `tfmlops`
logger (`-q`, `-v`); stdout carries only the command's JSON result.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from pathlib import Path

from tfmlops import logs, stage_spec
from tfmlops.harness import run_command

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfmlops",
        description="From a folder of images to a production TensorFlow model. "
        "Stages normally run through `dvc repro`; each can also run alone.",
    )
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_const", dest="verbosity",
                      const=logs.QUIET, default=logs.NORMAL,
                      help="warnings and errors only")
    loud.add_argument("-v", "--verbose", action="store_const", dest="verbosity",
                      const=logs.VERBOSE,
                      help="debug messages, and TensorFlow's own logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for spec in stage_spec.specs():  # each stage's package is light: no TensorFlow
        name, text = spec.name, spec.help
        p = sub.add_parser(name, help=text, description=text)
        if name == "promote":
            _promote_options(p)
        if name == "train":
            p.add_argument("--fresh", action="store_true",
                           help="fit afresh even when tune's final round fitted this very model "
                           "(by default train adopts that fit)")
    for verb, text in (("approve", "move a version awaiting approval (or inconclusive) to "
                        "@production"),
                       ("reject", "record that a version must not reach @production")):
        p = sub.add_parser(verb, help=text, description=text.capitalize() + ", in the promotion "
                           "ledger with who and why. A workflow, not an access control: anyone "
                           "with EDIT on the model can move an alias in MLflow.")
        p.add_argument("version", type=int, metavar="VERSION")
        p.add_argument("--reason", required=True, help="why (recorded in the promotion ledger)")
    sub.add_parser("check", help="validate params.yaml and exit",
                   description="Validate params.yaml and exit.")
    sub.add_parser("doctor", help="train 2 epochs on built-in digits in a temp folder; print "
                   "the resolved precision, strategy and devices",
                   description="Train the params' model for 2 epochs on the built-in digits "
                   "in a temporary folder (the real stages, their own MLflow store) and print "
                   "what this machine resolves: precision policy, strategy, replicas, devices, "
                   "XLA. The check for GPU-only paths.")
    p = sub.add_parser("serve", help="serve a registered model over HTTP (MLflow's URL API, "
                       "with tfmlops' request checks)",
                       description="MLflow's scoring server (/invocations, /ping, /health, "
                       "/version) for MODEL, accepting JSON bodies up to "
                       "export.serving.max_body_bytes; every refusal is one line.")
    p.add_argument("-m", "--model-uri", required=True,
                   help="e.g. models:/digits-classifier@production (MLFLOW_TRACKING_URI: the store)")
    p.add_argument("-H", "--host", default="127.0.0.1", help="default: %(default)s")
    p.add_argument("-p", "--port", type=int, default=5000, help="default: %(default)s")
    p.add_argument("-w", "--workers", type=int, default=1, help="server processes "
                   "(default: %(default)s)")
    p = sub.add_parser("history", help="list every promotion decision in order (the ledger)",
                       description="The promotion ledger of promote.registered_model, oldest "
                       "first: when, who (mlflow.user), the decision, @production before and "
                       "after, the version decided about, the commit and why.")
    p.add_argument("--json", action="store_true", help="one JSON list instead of a table")
    p = sub.add_parser("compare", help="two registered versions (or two runs) side by side: "
                       "params, metric and per-class deltas, the images whose prediction flipped",
                       description="Evaluate versions A and B of promote.registered_model on "
                       "the same current test images (as promote does) and show the params "
                       "that differ in their lineage runs, the metric and per-class deltas "
                       "(B - A) and the images whose prediction flipped; kept in a `compare` "
                       "MLflow run (compare.md, compare.html with thumbnails). Two run ids: "
                       "their params and metrics.")
    p.add_argument("a", metavar="A", help="a version number (or a run id)")
    p.add_argument("b", metavar="B", help="a version number (or a run id)")
    p.add_argument("--runs", action="store_true", help="A and B are MLflow run ids (the "
                   "default when they are not numbers)")
    p.add_argument("--flipped", type=int, default=50, metavar="N",
                   help="list at most N flipped images (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="the comparison as JSON instead of tables")
    sub.add_parser("accept-reference", help="accept the last prepare's data profile as the "
                   "reference later runs are checked against",
                   description="Copy reports/data_profile.json to data.contract.reference; "
                   "commit that file. Later prepares report drift and anomalies against it.")
    sub.add_parser("sync", help="upload MLflow calls queued while the server was away",
                   description="Replay reports/outbox/*.jsonl against the tracking store.")
    return parser


def _promote_options(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--rollback", action="store_true",
                   help="move @production back to the version holding @previous "
                   "(holds across dvc repro)")
    g.add_argument("--version", type=int, help="gate this registered version")
    g.add_argument("--adopt", action="store_true",
                   help="keep the version an alias move outside tfmlops put in @production")
    g.add_argument("--release", action="store_true",
                   help="undo an alias move outside tfmlops: back to the ledger's version")
    p.add_argument("--force", action="store_true",
                   help="with --version: skip the gate (recorded as forced; holds "
                   "across dvc repro)")
    p.add_argument("--reason", help="why (recorded in the promotion ledger)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.verbosity)  # before any stage imports TensorFlow
    if args.command in stage_spec.PIPELINE and stage_spec.spec(args.command).keras == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported
    # A stage ends as on Ctrl-C on SIGTERM; `serve` keeps the default (its server stops).
    return run_command(args.command, lambda: _command(args),
                       sigterm=args.command != "serve")


def entry() -> None:
    """The `tfmlops` program (its console script, `python -m tfmlops`): main, then exit.

    A command that left TensorFlow unloaded has its objects frozen out of the garbage
    collector first: the interpreter's exit would walk every one of them (numpy,
    PIL, the manifest's rows), several times longer than frozen (BENCHMARKS.md, figures behind the code).
    atexit handlers and finalizers still run; only cycles left
    at exit are not collected, which the interpreter does not promise to do anyway.
    TensorFlow's objects (summary writers, datasets) may flush as they are collected:
    after a TensorFlow stage the interpreter exits as usual.
    """
    code = main()
    if "tensorflow" not in sys.modules:
        gc.freeze()
    sys.exit(code)


def _command(args: argparse.Namespace):
    """What `tfmlops <command>` returns (its JSON result); harness.run_command runs it."""
    if args.command == "serve":  # needs no params.yaml: the model carries its settings
        from tfmlops.serving.server import serve_model

        serve_model(args.model_uri, args.host, args.port, args.workers)
        return None
    from tfmlops.config import load_config

    cfg = load_config(args.params)
    if args.command == "check":
        log.info("%s: ok", args.params)
        return None
    # The CLI reaches a stage only by its name (stage_spec.package), never by importing it.
    if args.command == "history":
        return stage_spec.package("promote").show_history(cfg, as_json=args.json)
    if args.command == "compare":
        with _others_logged(cfg, args.command):
            return stage_spec.package("promote").show_comparison(
                cfg, args.a, args.b, runs=args.runs, most=args.flipped, as_json=args.json)
    if args.command == "accept-reference":
        return stage_spec.package("prepare").accept(cfg)
    if args.command == "sync":
        from tfmlops.tracking import sync

        return sync(cfg)
    if args.command in ("approve", "reject"):
        promote = stage_spec.package("promote")
        return promote.run(cfg, **{args.command: args.version, "reason": args.reason})
    module = stage_spec.package(args.command)
    with _others_logged(cfg, args.command):
        if args.command == "promote":
            return module.run(cfg, rollback=args.rollback, version=args.version, force=args.force,
                              adopt=args.adopt, release=args.release, reason=args.reason)
        if args.command == "train":
            return module.run(cfg, fresh=args.fresh)
        return module.run(cfg)


def _others_logged(cfg, command: str):
    """What other libraries print during `command` -> .tfmlops/logs/<command>.log."""
    return logs.others_to(Path(cfg.paths.reports).parent / logs.STAGE_LOGS / f"{command}.log")
