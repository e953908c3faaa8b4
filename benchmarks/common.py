"""Shared benchmark plumbing: a scratch workdir with real prepared data, results files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "reports" / "benchmarks"


def scratch_config(workdir: Path | None = None, repo: Path = ROOT, load: bool = True,
                   **sections):
    """The repo's params (`repo`: another checkout's) with every path under a scratch
    dir and tracking off; (the Config, or None unless `load`, the scratch dir)."""
    from tfmlops.config import load_config

    workdir = Path(workdir or tempfile.mkdtemp(prefix="tfmlops-bench-"))
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["paths"] = {k: str(workdir / v) for k, v in params["paths"].items()}
    params["data"]["image_dir"] = params["paths"]["builtin"]
    params["tracking"]["enabled"] = False
    params["profiling"]["enabled"] = False
    for section, values in sections.items():
        if isinstance(values, dict):
            params.setdefault(section, {}).update(values)
        else:
            params[section] = values
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return (load_config(workdir / "params.yaml") if load else None), workdir


def machine() -> dict:
    flags = ""
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                flags = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
                                 if f in have)
                break
    gpu = "none"
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            gpu = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cores": os.cpu_count(), "cpu_flags": flags, "gpu": gpu,
            "python": platform.python_version(), "machine": platform.machine()}


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **result}, indent=2) + "\n")
    return path


def tree_rss(proc) -> int:
    """RSS of a psutil.Process and all its children, in bytes (a pool's workers count too)."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total
