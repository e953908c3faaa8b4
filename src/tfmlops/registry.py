"""The MLflow model registry: register exported versions, read them, move aliases safely.

With the tracking package, the only code that calls MLflow. Aliases, never the
deprecated stages: `production`, `previous` (what production replaced, the
rollback target) and `candidate` (refused by the gate).

Moving an alias is a last-writer-wins upsert, so promotions hold a lock: a
registered model named `<model>.promotion-lock`, created atomically (the
store's unique name constraint: a second creator gets RESOURCE_ALREADY_EXISTS)
and deleted at the end. The holder re-reads the lock before moving aliases; a
lock whose holder died (same host, pid gone) or whose lease ran out is broken.

Calls are retried by the tracking package's one retry helper (bounded backoff,
with jitter here so competing promotions do not retry in step); a registry that
stays away raises TrackingUnavailable (a promotion is never queued for later).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.errors import DataError, TrackingUnavailable
from tfmlops.tracking.retry import RetriesExhausted, call_with_retry, error_code, first_line

log = logging.getLogger(__name__)

PRODUCTION, PREVIOUS, CANDIDATE = "production", "previous", "candidate"
LOCK_SUFFIX = ".promotion-lock"
LOCK_LEASE_S = 120.0  # a promotion takes seconds; a lock older than this is abandoned
LOCK_WAIT_S = 300.0
DESCRIPTION_LIMIT = 4900  # the SQL store keeps 5,000 characters of a version description

# Version tags the gate reads (written by `export`).
TAG_ACCURACY = "serving.accuracy"
TAG_BYTES = "serving.bytes"
TAG_LATENCY = "serving.latency_p50_ms"
TAG_PARITY = "parity.passed"

_PERMANENT = {"RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "INVALID_PARAMETER_VALUE"}


class Registry:
    """One registered model in the configured store."""

    def __init__(self, cfg: Config, name: str | None = None):
        self.cfg = cfg
        self.name = name or cfg.promote.registered_model
        self.uri = tracking.tracking_uri(cfg)
        tracking.ensure_reachable(self.uri, cfg.tracking.connect_timeout_s)
        self.client = tracking.use_uri(self.uri).MlflowClient(tracking_uri=self.uri,
                                                              registry_uri=self.uri)

    # -- reading
    def alias(self, alias: str) -> str | None:
        """The version holding `alias`, or None."""
        return self.aliases().get(alias)

    def aliases(self) -> dict[str, str]:
        try:
            model = self._call(lambda c: c.get_registered_model(self.name), "read the model")
        except _Missing:
            return {}
        return {a: str(v) for a, v in (model.aliases or {}).items()}

    def tags(self, version: str) -> dict[str, str]:
        try:
            mv = self._call(lambda c: c.get_model_version(self.name, str(version)),
                            f"read version {version}")
        except _Missing:
            raise DataError(f"version {version} of registered model {self.name} does not exist; "
                            f"see the versions with `mlflow models` or the MLflow UI") from None
        return dict(mv.tags or {})

    def exists(self, version: str) -> bool:
        try:
            self._call(lambda c: c.get_model_version(self.name, str(version)), "read a version")
            return True
        except _Missing:
            return False

    # -- writing
    def set_alias(self, alias: str, version: str) -> None:
        self._call(lambda c: c.set_registered_model_alias(self.name, alias, str(version)),
                   f"set @{alias}")

    def delete_alias(self, alias: str) -> None:
        with contextlib.suppress(_Missing):
            self._call(lambda c: c.delete_registered_model_alias(self.name, alias),
                       f"delete @{alias}")

    def tag_version(self, version: str, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self._call(lambda c, k=key, v=value: c.set_model_version_tag(
                self.name, str(version), k, str(v)), f"tag version {version}")

    def register(self, model_uri: str, tags: dict[str, Any], description: str) -> str:
        """A new version of this model from a logged model; returns its number."""
        if len(description) > DESCRIPTION_LIMIT:
            description = description[:DESCRIPTION_LIMIT] + "\n\n(truncated: see model_card.md)"

        def create(client):
            with contextlib.suppress(Exception):  # exists already: fine
                client.create_registered_model(self.name)
            return client.create_model_version(
                self.name, model_uri, tags={k: str(v) for k, v in tags.items()},
                description=description)

        return str(self._call(create, "register a version").version)

    # -- the promotion lock
    @contextlib.contextmanager
    def promotion_lock(self, wait_s: float = LOCK_WAIT_S) -> Iterator[Callable[[], None]]:
        """Hold the model's promotion lock; yields `check()`, which raises if it was lost."""
        lock = self.name + LOCK_SUFFIX
        me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + wait_s
        waited = False
        while True:
            tags = {"tfmlops.lock.holder": me,
                    "tfmlops.lock.expires": f"{time.time() + LOCK_LEASE_S:.3f}"}
            try:
                self._call(lambda c, t=tags: c.create_registered_model(
                    lock, tags=t, description=f"promotion of {self.name} in progress (tfmlops)"),
                    "take the promotion lock")
                break
            except _Exists:
                pass
            holder = self._lock_tags(lock)
            if holder is not None and _abandoned(holder):
                self._break_lock(lock, holder)
                continue
            if time.monotonic() > deadline:
                who = (holder or {}).get("tfmlops.lock.holder", "unknown")
                raise DataError(
                    f"another promotion of {self.name} holds the lock ({who}) after {wait_s:.0f} s "
                    f"of waiting; if none is running, delete the registered model {lock}")
            if not waited:
                log.info("promote: waiting for another promotion of %s to finish", self.name)
                waited = True
            time.sleep(0.2 + random.random() * 0.3)

        def check() -> None:
            tags = self._lock_tags(lock) or {}
            if tags.get("tfmlops.lock.holder") != me:
                raise DataError(f"lost the promotion lock of {self.name} (held too long?); "
                                "nothing was changed, run the promotion again")

        try:
            yield check
        finally:
            current = self._lock_tags(lock) or {}
            if current.get("tfmlops.lock.holder") == me:
                with contextlib.suppress(_Missing):
                    self._call(lambda c: c.delete_registered_model(lock), "release the lock")

    def _lock_tags(self, lock: str) -> dict[str, str] | None:
        try:
            return dict(self._call(lambda c: c.get_registered_model(lock), "read the lock").tags)
        except _Missing:
            return None

    def _break_lock(self, lock: str, seen: dict[str, str]) -> None:
        # Re-read just before deleting: another waiter may have broken it and retaken it.
        now = self._lock_tags(lock)
        if now is not None and now.get("tfmlops.lock.holder") == seen.get("tfmlops.lock.holder"):
            log.warning("promote: breaking the abandoned promotion lock of %s (%s)",
                        self.name, seen.get("tfmlops.lock.holder"))
            with contextlib.suppress(_Missing):
                self._call(lambda c: c.delete_registered_model(lock), "break the lock")

    # -- machinery
    def _call(self, fn, what: str):
        attempts = self.cfg.tracking.retries + 1
        try:
            return call_with_retry(lambda: fn(self.client), attempts, final_codes=_PERMANENT,
                                   jitter=True)
        except RetriesExhausted as exc:
            raise TrackingUnavailable(
                f"model registry at {self.uri} failed to {what} after {attempts} attempts "
                f"({first_line(exc.last, 160)}); check the store, then run again") from None
        except Exception as exc:  # noqa: BLE001 - a final code: the store answered
            code = error_code(exc)
            if code == "RESOURCE_DOES_NOT_EXIST":
                raise _Missing(str(exc)) from None
            if code == "RESOURCE_ALREADY_EXISTS":
                raise _Exists(str(exc)) from None
            raise


class _Missing(Exception):
    pass


class _Exists(Exception):
    pass


def _abandoned(tags: dict[str, str]) -> bool:
    """The lock's lease ran out, or its holder was a process on this host that is gone."""
    try:
        if time.time() > float(tags.get("tfmlops.lock.expires", "inf")):
            return True
    except ValueError:
        return True
    host, _, rest = tags.get("tfmlops.lock.holder", "").partition(":")
    pid = rest.partition(":")[0]
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


# ------------------------------------------------------------ logging a model

def log_serving_model(run: tracking.StageRun, folder: Path, runtime_file: str,
                      example: dict[str, Any]) -> str | None:
    """Log the pyfunc serving model (models-from-code) in `run`; returns its model URI."""
    import tfmlops
    from tfmlops.serving.predictor import CONFIG_ARTIFACT, CONFIG_FILE, MODEL_ARTIFACT

    package = Path(tfmlops.__file__).parent
    result: dict[str, str] = {}

    def log(mlflow):
        import pandas as pd

        info = mlflow.pyfunc.log_model(
            name="model",
            # models-from-code: MLflow runs this file at load time (no pickle); the
            # package travels along as code so the model loads where tfmlops is absent.
            python_model=str(package / "serving" / "pyfunc_model.py"),
            artifacts={MODEL_ARTIFACT: str(folder / runtime_file),
                       CONFIG_ARTIFACT: str(folder / CONFIG_FILE)},
            code_paths=[str(package)],
            signature=_serving_signature(),
            input_example=pd.DataFrame([example]),
            pip_requirements=_serving_requirements(),
        )
        result["uri"] = info.model_uri

    run.call(log, "serving model")
    return result.get("uri")


def save_keras_flavor(model, path: Path, example) -> None:
    """The plain MLflow Keras flavor of `model` in a folder (the serving benchmark's baseline)."""
    mlflow = tracking.import_mlflow()
    from mlflow.models import infer_signature

    signature = infer_signature(example, model.predict(example, verbose=0))
    mlflow.tensorflow.save_model(model, str(path), signature=signature)


def _serving_signature():
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, Schema

    inputs = Schema([
        ColSpec("string", "image", required=False),  # base64 PNG/JPEG bytes
        # H*W*C floats, row-major, normalized: flat, so MLflow checks it in one vector op
        ColSpec(Array("double"), "pixels", required=False),
    ])
    outputs = Schema([
        ColSpec("string", "label"),
        ColSpec("long", "label_index"),
        ColSpec(Array("double"), "probabilities"),
    ])
    return ModelSignature(inputs=inputs, outputs=outputs)


def _serving_requirements() -> list[str]:
    return tracking.pinned_requirements(
        "mlflow", "numpy", "pandas", "Pillow", "onnxruntime", "ai-edge-litert")
