"""Promotion safety on a real MLflow registry (temp SQLite), without training a model.

Versions are registered from a placeholder source with the tags `export`
writes: the gate reads nothing else. Crashes are real: a promotion in its own
process is SIGKILLed after N real registry writes (issue 14: items 3, 12, 13, 14).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import VENV_BIN, child_env, stage_runs
from tfmlops.config import load_config, replace

pytestmark = pytest.mark.timeout(600)

GOOD = {"serving.accuracy": "0.99", "serving.bytes": "1000", "serving.latency_p50_ms": "1.0",
        "parity.passed": "true", "edge.top1_agreement": "1.0"}


@pytest.fixture
def reg(make_cfg, tmp_path):
    """(cfg, registry, register()): a fresh registered model in a temp SQLite store."""
    from tfmlops.registry import Registry

    # No model behind the versions: the gate reads their tags alone (no evaluation).
    cfg = make_cfg(promote={"registered_model": "safety", "lock_lease_s": 3.0,
                            "gate": {"evaluate": False}})
    registry = Registry(cfg)
    count = iter(range(1, 1000))

    def register() -> str:
        return registry.register(f"file:///nowhere/model-{next(count)}", GOOD, "test version")

    return cfg, registry, register


def decision(cfg) -> dict:
    return json.loads((Path(cfg.paths.reports) / "promote.json").read_text())


# The promotion of a version in its own process, SIGKILLed after `n` real registry writes:
# no finally block and no lock release runs, as when a machine or a job runner kills it.
KILLED_PROMOTION = """
import os, signal, sys
from tfmlops.config import load_config
from tfmlops import registry as registry_module
from tfmlops.stages import promote
n = int(sys.argv[3])
done = []
real_init = registry_module.Registry.__init__

def init(self, *a, **k):
    real_init(self, *a, **k)
    for name in ("set_registered_model_alias", "set_model_version_tag",
                 "delete_registered_model_alias", "set_registered_model_tag"):
        real = getattr(self.client, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            if len(done) >= n:
                os.kill(os.getpid(), signal.SIGKILL)
            result = _real(*args, **kwargs)
            done.append(_name)
            print("wrote", _name, flush=True)
            return result

        setattr(self.client, name, wrapped)

registry_module.Registry.__init__ = init
promote.run(load_config(sys.argv[1]), version=int(sys.argv[2]))
print("finished", flush=True)
"""


# ----------------------------------------------------------------- item 12

@pytest.mark.slow
@pytest.mark.parametrize("n", range(7))
def test_a_crash_after_any_write_of_a_promotion_never_makes_rollback_restore_the_wrong_version(
        reg, n):
    """v1 then v2 promoted; the promotion of v3 is killed (SIGKILL) after `n` registry
    writes (the ledger's pending entry, the version tag, @previous, @production, the
    outcome tags, the confirmation), its lock left held. Then --rollback must wait out the
    lease, restore the version production replaced (never an older one), and running the
    promotion again must complete it. The ledger settles the interrupted move (confirmed
    when @production reached it, else aborted), never takes it for an outside move, and
    lists every move that happened."""
    from tfmlops.stages import promote

    cfg, registry, register = reg
    v1, v2, v3 = register(), register(), register()
    promote.run(cfg, version=int(v1))
    promote.run(cfg, version=int(v2))
    assert registry.aliases() == {"production": v2, "previous": v1}

    writes = crash_promotion(cfg, v3, n)
    assert len(writes) == n, writes

    production = registry.alias("production")
    assert production in (v2, v3)
    expected = v1 if production == v2 else v2  # what the current production replaced
    result = promote.run(cfg, rollback=True)
    ledger = _ledger(registry)
    assert "moved_from_outside" not in [e["decision"] for e in ledger]
    interrupted = [e for e in ledger if e["version"] == v3 and e["decision"].startswith("gate")]
    if interrupted:  # the kill came after the pending entry
        assert interrupted[0]["state"] == ("confirmed" if production == v3 else "aborted")
    if result["outcome"] == "repaired":  # @previous was already moved: fixed, not rolled back
        assert result["production"] == production
        result = promote.run(cfg, rollback=True)
    assert result["production"] == expected, (n, writes, decision(cfg))

    # Starting again from the crash: the promotion completes and stays reversible.
    fresh_cfg, fresh, fresh_register = _fresh(cfg, f"again-{n}")
    w1, w2, w3 = fresh_register(), fresh_register(), fresh_register()
    promote.run(fresh_cfg, version=int(w1))
    promote.run(fresh_cfg, version=int(w2))
    crash_promotion(fresh_cfg, w3, n)
    promote.run(fresh_cfg, version=int(w3))
    assert fresh.aliases() == {"production": w3, "previous": w2}
    assert promote.run(fresh_cfg, rollback=True)["production"] == w2
    assert fresh.aliases() == {"production": w2, "previous": w1}
    assert _locks(registry) == [] and _locks(fresh) == []  # the killed holders' locks broken
    moved = [(e["from"], e["to"]) for e in _ledger(fresh) if e["moved"]]
    assert moved == [("-", w1), (w1, w2), (w2, w3), (w3, w2)]


def _ledger(registry) -> list[dict]:
    from tfmlops.stages.promote.history import history

    return history(registry)


def crash_promotion(cfg, version: str, n: int) -> list[str]:
    """`promote --version` in a process SIGKILLed after `n` real registry writes; the
    writes it made. Its promotion lock is left held, as a real kill leaves it."""
    params = Path(cfg.paths.reports).parent / f"params-killed-{version}-{n}.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    proc = subprocess.run([sys.executable, "-c", KILLED_PROMOTION, str(params), version, str(n)],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-3000:]
    assert "finished" not in proc.stdout
    return [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("wrote ")]


def _fresh(cfg, name: str):
    from tfmlops.registry import Registry

    path = Path(cfg.paths.reports).parent / f"params-{name}.yaml"
    params = cfg.to_dict()
    params["promote"]["registered_model"] = f"safety-{name}"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    fresh_cfg = load_config(path)
    registry = Registry(fresh_cfg)
    count = iter(range(1, 1000))
    return fresh_cfg, registry, lambda: registry.register(
        f"file:///nowhere/{name}-{next(count)}", GOOD, "test version")


# ------------------------------------------------------------------ item 3

def test_a_dvc_experiment_never_moves_production(reg, monkeypatch):
    from tfmlops.errors import ConfigError, DataError
    from tfmlops.stages import promote

    cfg, registry, register = reg
    v1, v2 = register(), register()
    promote.run(cfg, version=int(v1))

    monkeypatch.setenv("DVC_EXP_NAME", "sober-vent")
    result = promote.run(cfg, version=int(v2))
    assert result["outcome"] == "held" and result["production"] == v1
    assert registry.aliases() == {"production": v1, "exp-sober-vent": v2}
    d = decision(cfg)
    assert d["experiment"] == "sober-vent" and "experiments never move @production" in d["reason"]
    assert d["promoted"] is False and not d["failed"]
    run = [r for r in stage_runs(cfg, "promote")
           if r.data.tags.get("tfmlops.promote.candidate") == v2]
    assert run and run[0].data.tags["dvc.exp_name"] == "sober-vent"  # the same detection
    for command in ({"rollback": True}, {"version": int(v2), "force": True}):
        with pytest.raises(DataError, match="under `dvc exp run`"):
            promote.run(cfg, **command)
    assert registry.alias("production") == v1

    # `dvc exp run -S promote.from_experiments=true` is refused in one line
    allowed = cfg.to_dict()
    allowed["promote"]["from_experiments"] = True
    path = Path(cfg.paths.reports).parent / "params-allowed.yaml"
    path.write_text(yaml.safe_dump(allowed, sort_keys=False))
    with pytest.raises(ConfigError, match="from_experiments: true is no longer accepted"):
        load_config(path)

    monkeypatch.delenv("DVC_EXP_NAME")  # a person's `tfmlops promote --version`: gated
    assert promote.run(cfg, version=int(v2))["outcome"] == "promoted"
    assert registry.alias("production") == v2 and decision(cfg)["reason"] == "--version"


# ----------------------------------------------------------------- item 14

def test_registration_retried_after_a_committed_timeout_makes_no_duplicate(reg):
    cfg, registry, _ = reg
    real = registry.client.create_model_version
    calls = []

    def commit_then_time_out(*args, **kwargs):
        calls.append(real(*args, **kwargs))  # the server committed...
        raise ConnectionError("read timed out")  # ...and the answer was lost

    registry.client.create_model_version = commit_then_time_out
    version = registry.register("file:///nowhere/once", GOOD, "test version")
    registry.client.create_model_version = real
    versions = registry.client.search_model_versions(f"name = '{registry.name}'")
    assert len(calls) == 1 and [v.version for v in versions] == [int(version)]
    # The same key registered again (export's run and bytes) is the same version...
    keyed = registry.register("file:///nowhere/keyed", GOOD, "test", key="run1:abc")
    assert registry.register("file:///nowhere/keyed", GOOD, "test", key="run1:abc") == keyed
    # ...and without one, each call is a version of its own.
    assert registry.register("file:///nowhere/x", GOOD, "test") != keyed


# ----------------------------------------------------------------- item 13

HOLDER = """
import os, signal, sys, time
from tfmlops.config import load_config
from tfmlops.registry import Registry
registry = Registry(load_config(sys.argv[1]))
with registry.promotion_lock() as check:
    print("held", flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no release
    time.sleep(float(sys.argv[3]))  # slow, but alive: the heartbeat renews
    check()
    registry.set_alias("production", sys.argv[4])
print("released", flush=True)
"""


def _holder(cfg, mode: str, seconds: float = 0.0, version: str = "1") -> subprocess.Popen:
    params = Path(cfg.paths.reports).parent / f"params-holder-{cfg.promote.lock_lease_s:g}.yaml"
    params.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(params), mode, str(seconds), version],
                            env=child_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.slow
def test_a_dead_holder_is_replaced_after_its_lease(reg, caplog):
    from tfmlops.stages import promote

    cfg, registry, register = reg
    v1 = register()
    holder = _holder(cfg, "die")
    assert holder.wait(timeout=60) == -signal.SIGKILL
    start = time.monotonic()
    assert promote.run(cfg, version=int(v1))["outcome"] == "promoted"
    assert time.monotonic() - start >= cfg.promote.lock_lease_s  # not before the lease ran out
    assert "breaking the promotion lock" in caplog.text
    assert _locks(registry) == []  # broken and released: nothing left behind


@pytest.mark.slow
def test_a_slow_live_holder_is_not_broken(reg, caplog):
    """The holder keeps the lock for 2 leases while renewing; the waiter waits it out. The
    lease is long beside a renewal (every lease/4), so a machine at half speed, whose
    heartbeat thread may be late by seconds, still renews in time."""
    from tfmlops.stages import promote

    cfg, registry, register = reg
    cfg = replace(cfg, promote=replace(cfg.promote, lock_lease_s=15.0))
    v1, v2 = register(), register()
    holder = _holder(cfg, "slow", seconds=2 * cfg.promote.lock_lease_s, version=v1)
    assert promote.run(cfg, version=int(v2))["outcome"] == "promoted"
    assert holder.wait(timeout=60) == 0, "the holder lost its lock while alive"
    assert "breaking the promotion lock" not in caplog.text
    # Serialized: the holder's write came first, the promotion replaced it.
    assert registry.aliases() == {"production": v2, "previous": v1}


@pytest.mark.slow
@pytest.mark.distributed
def test_racing_promotions_leave_exactly_one_production(reg, make_cfg):
    _, registry, register = reg
    # Three processes importing MLflow on 2 cores: a 3 s lease let a starved renewal thread
    # lose a live holder's lock. The lock's logic is tested on short leases above.
    cfg = make_cfg(promote={"registered_model": "safety", "lock_lease_s": 15.0,
                            "gate": {"evaluate": False}})
    versions = [register() for _ in range(3)]
    procs = [subprocess.Popen([str(VENV_BIN / "tfmlops"), "promote", "--version", v],
                              cwd=Path(cfg.paths.reports).parent, env=child_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for v in versions]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[-6000:] for o in outs]
    runs = stage_runs(cfg, "promote")
    chain = {r.data.tags["tfmlops.promote.candidate"]:
             r.data.tags["tfmlops.promote.production_before"] for r in runs}
    # One after the other: each saw the one before it, so production_before forms one chain.
    assert sorted(chain) == sorted(versions)
    firsts = [v for v, before in chain.items() if before in ("None", "", None)]
    assert len(firsts) == 1
    order = firsts
    while len(order) < 3:
        order.append(next(v for v, before in chain.items() if before == order[-1]))
    assert registry.aliases() == {"production": order[-1], "previous": order[-2]}
    assert _locks(registry) == []


def _locks(registry):
    return [m.name for m in registry.client.search_registered_models()
            if ".promotion-lock" in m.name]


# ------------------------------------- a write retried under the lock (issue 27, item 5)

def _flaky(client, method: str, failures: int, between=None) -> list[int]:
    """`client.<method>` raises ConnectionError `failures` times (calling `between()` after
    each), then goes through; returns the list its attempts are counted in."""
    real, attempts = getattr(client, method), []

    def wrapped(*args, **kwargs):
        attempts.append(1)
        if len(attempts) <= failures:
            if between is not None:
                between()
            raise ConnectionError("read timed out")
        return real(*args, **kwargs)

    setattr(client, method, wrapped)
    return attempts


def test_a_write_is_not_retried_once_the_lock_was_lost(reg):
    """The first attempt fails and, meanwhile, the lock goes to another promotion: the
    retry must not land (ownership is checked before every attempt, not once)."""
    from tfmlops.errors import DataError
    from tfmlops.registry import LOCK_HOLDER, LOCK_SUFFIX

    cfg, registry, register = reg
    v1 = register()
    lock = registry.name + LOCK_SUFFIX

    def taken_over():
        registry.client.set_registered_model_tag(lock, LOCK_HOLDER, "someone-else")

    attempts = _flaky(registry.client, "set_registered_model_alias", 1, between=taken_over)
    with pytest.raises(DataError, match="lost the promotion lock"):
        with registry.promotion_lock():
            registry.set_alias("production", v1)
    assert len(attempts) == 1 and registry.aliases() == {}


def test_retries_under_the_lock_end_within_half_the_lease(make_cfg):
    """With tracking.retries 10 a write would retry for about a minute (past the 3 s
    lease); under the lock its attempts stop within half the lease."""
    from tfmlops.errors import TrackingUnavailable
    from tfmlops.registry import Registry

    cfg = make_cfg(promote={"registered_model": "budget", "lock_lease_s": 3.0},
                   tracking={"retries": 10})
    registry = Registry(cfg)
    attempts = _flaky(registry.client, "set_registered_model_alias", 1000)
    with pytest.raises(TrackingUnavailable, match="failed to set @production"):
        with registry.promotion_lock():
            registry.set_alias("production", "1")
    assert 1 <= len(attempts) <= 3, len(attempts)  # jittered pauses 0.25-0.75 s, 0.5-1.5 s


def test_an_alias_moved_by_another_writer_during_the_promotion_is_a_conflict(reg):
    """A writer outside the lock (an old tfmlops, a hand in the UI) moves @production
    right after this promotion's write: the re-read after the writes reports it."""
    from tfmlops.errors import DataError
    from tfmlops.stages.promote.decide import Request, act
    from tfmlops.stages.promote.moves import Actor
    from tfmlops.stages.promote.workspace import Checkout

    cfg, registry, register = reg
    v1, v2 = register(), register()
    real = registry.client.set_registered_model_alias

    def and_another_writer(name, alias, version):
        real(name, alias, version)
        if alias == "production":
            real(name, "production", v2)  # the other writer's move lands after ours

    registry.client.set_registered_model_alias = and_another_writer
    actor = Actor("tester", None, None, "run")
    with pytest.raises(DataError) as caught:
        act(cfg, registry, Request("gate", v1), v1, actor, lambda: None,
            checkout=Checkout.read(Path(cfg.paths.reports)), data="none", out_dir=None)
    assert str(caught.value).startswith(
        f"conflict on safety: @production is {v2}, this promotion left version {v1}: another "
        "writer moved the aliases")


def test_the_wait_for_the_lock_outlasts_a_lease_longer_than_it(reg, caplog):
    """A dead holder's lease (3 s) longer than the wait (1 s): the waiter still breaks it
    after the lease instead of giving up while it is still within it."""
    cfg, registry, register = reg
    holder = _holder(cfg, "die")
    assert holder.wait(timeout=60) == -signal.SIGKILL
    with registry.promotion_lock(wait_s=1.0):
        pass
    assert "breaking the promotion lock" in caplog.text
    assert _locks(registry) == []


def test_a_write_needs_a_margin_of_the_lease_left(reg):
    """Review L4: a write that starts just inside the lease can land after a waiter broke
    it. `check()` now wants `margin_s` of the lease left, so a holder whose renewals
    stopped (a paused process) stops writing while a waiter still has to wait."""
    from tfmlops.errors import DataError

    cfg, registry, register = reg
    v1 = register()
    with pytest.raises(DataError, match="not renewed for"):
        with registry.promotion_lock():
            lease = registry._lease
            lease.stop()  # no renewal from here on, as in a paused process
            time.sleep(lease.lease_s - lease.margin_s + 0.2)
            assert time.monotonic() - lease.renewed < lease.lease_s  # no waiter may break it yet
            registry.set_alias("production", v1)
    assert registry.aliases() == {}


def test_a_store_that_keeps_refusing_the_create_ends_at_the_deadline(reg):
    """Review L9: a create answered 'does not exist' every time (the SQL store's clash
    path) used to loop at once without a pause or a deadline."""
    import threading

    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

    from tfmlops.errors import DataError

    cfg, registry, register = reg
    attempts, raised = [], []

    def missing(*args, **kwargs):
        attempts.append(1)
        raise MlflowException("no such model", error_code=RESOURCE_DOES_NOT_EXIST)

    registry.client.create_registered_model = missing

    def take():
        try:
            with registry.promotion_lock(wait_s=1.0):
                pass
        except DataError as exc:
            raised.append(str(exc))

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), f"still trying after 30 s ({len(attempts)} creates)"
    assert raised and "after 1 s of waiting" in raised[0], raised
    assert len(attempts) <= 1.0 / 0.02 + 1  # each try paused
