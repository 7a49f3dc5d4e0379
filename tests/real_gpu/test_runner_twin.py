"""The GPU runner's phases end to end, with the twin standing in for SGLang on the GPU.

The runner cannot be run here on a GPU, but everything around the GPU can: the same command
lines (the twin accepts SGLang's flags it does not model), the harness's start and stop, the
smoke checks, kvpilot's predictions from each server, kvpilot's own command line and process
launcher running the experiment under the load generator, the A/B's windows, and the files a call
returns. The processes kvpilot's tools start also record what they import, which must all be in
the GPU image or the bundle's lock.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from playbooks.sources import gpu as gpu_source
from playbooks.sources.gpu import FakeGpuReader, GpuState
from sim.presets import PRESETS
from tests.ports import free_port
from tests.real_gpu import archive, image, runner
from tests.real_gpu import env as genv
from tests.real_gpu import run as run_cli
from tests.real_gpu.bundle import LOCK
from tests.real_gpu.call import Call
from tests.real_gpu.commands import sglang_command
from tests.real_gpu.lock import parse_lock
from tests.real_gpu.plan import Settings, make_plan
from tests.real_gpu.server import Machine
from tests.twin_process import REPO

TIME_SCALE = 20.0
GIB = 1 << 30
H100 = GpuState(
    0, "NVIDIA H100 80GB HBM3", "GPU-0", 81559 << 20, GIB // 2, (81559 << 20) - GIB // 2, 0, 0
)
RECORDER = """\
import atexit, os, sys
def _record():
    path = os.path.join(os.environ["KVPILOT_RECORD_MODULES"], f"{os.getpid()}.txt")
    with open(path, "w") as f:
        f.write("\\n".join(sorted({m.split(".")[0] for m in list(sys.modules)})))
atexit.register(_record)
"""

TWIN = PRESETS["llama-3.1-8b-h100"]  # the twin stands in for the GPU with this preset


def twin(fraction: float, extra: Sequence[str]) -> list[str]:
    """The runner's SGLang command line, served by the twin as SGLang 0.5.17 on an H100."""
    command = sglang_command(sys.executable, Path("/nonexistent/model"), fraction, extra)
    at = command.index("sglang.launch_server")
    twin_flags = ["--preset", "llama-3.1-8b-h100", "--time-scale", f"{TIME_SCALE:g}"]
    return [
        *command[:at],
        "sim.launch_server",
        *twin_flags,
        "--sglang-version",
        "0.5.17",
        *command[at + 1 :],
    ]


def machine(tmp_path: Path) -> Machine:
    recorder = tmp_path / "recorder"
    recorder.mkdir()
    (recorder / "sitecustomize.py").write_text(RECORDER)
    (tmp_path / "modules").mkdir()
    server_env = {**os.environ, "PYTHONPATH": str(REPO)}
    tool_env = {
        **os.environ,
        "PYTHONPATH": f"{recorder}{os.pathsep}{REPO}",
        "KVPILOT_RECORD_MODULES": str(tmp_path / "modules"),
    }
    return Machine(
        python=sys.executable,
        server=twin,
        server_env=server_env,
        tool_env=tool_env,
        gpus=FakeGpuReader([H100]),
        logs=tmp_path / "logs",
        local_gpus=False,
        time_scale=TIME_SCALE,
        start_timeout_s=60.0,
    )


def run(tmp_path: Path, s: Settings) -> tuple[int, dict[str, Any]]:
    m = machine(tmp_path)
    lines: list[str] = []
    call = Call(m, s, tmp_path / "call", lines.append, time.monotonic() + s.budget_s)
    plan = make_plan(s, jit_cached=True, unpacked=True)
    out = tmp_path / "out"
    code = runner.run_phases(call, plan, out, {"gpu": m.gpu()}, None)
    found = {p.name: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert (out / "results.txt").is_file() and (out / "logs.tar.xz").is_file()
    assert len(list(out.iterdir())) <= 8
    return code, found


def test_smoke_and_capacity_on_the_twin(tmp_path: Path) -> None:
    s = Settings(phases=("smoke", "capacity"), port=free_port(), budget_s=300)
    code, found = run(tmp_path, s)
    assert code == 0, found
    smoke = found["smoke.json"]
    assert [c["ok"] for c in smoke["checks"]] == [True] * 4, smoke["checks"]
    assert [r["completion_tokens"] for r in smoke["requests"]] == [32, 128, 128, 128, 128]
    capacity = found["capacity.json"]
    servers = capacity["servers"]
    assert [(x["fraction"], x["source"]) for x in servers] == [
        (0.4, "smoke"),
        (0.6, "capacity"),
        (0.85, "capacity"),
    ]
    assert servers[0]["max_total_num_tokens"] < servers[1]["max_total_num_tokens"]
    assert servers[0]["sglang_pre_load_gib"] == pytest.approx(TWIN.memory.free_before_load_gib)
    # every started server predicts every other fraction, and the experiment's target
    assert {(r["from"], r["to"]) for r in capacity["rows"]} == {
        (f, t) for f in (0.4, 0.6, 0.85) for t in (0.4, 0.6, 0.82, 0.85) if f != t
    }
    row = next(r for r in capacity["rows"] if (r["from"], r["to"]) == (0.4, 0.85))
    assert row["real"] == servers[2]["max_total_num_tokens"] and abs(row["server_error"]) < 0.1
    run_json = found["run.json"]
    assert [(r["phase"], r["status"]) for r in run_json["ran"]] == [
        ("smoke", "ok"),
        ("capacity", "ok"),
    ]


def test_an_experiment_the_gate_reverts_on_the_twin(tmp_path: Path) -> None:
    s = Settings(
        phases=("experiment",),
        port=free_port(),
        clients=16,
        change="max_running_requests=4",  # a cap far below the 16 running: it must go back
        start_extra=("--chunked-prefill-size", "4096"),
        budget_s=1000,  # the plan counts GPU seconds; the twin takes a tenth of them
    )
    code, found = run(tmp_path, s)
    exp = found["experiment.json"]
    assert exp["status"] == "ok", exp.get("error")
    assert exp["change"] == (
        "mem_fraction_static=0.4 --chunked-prefill-size 4096 -> max_running_requests=4"
    )
    assert exp["exit_status"] == exp["experiment"]["exit_code"]
    assert exp["state"] == "reverted" and exp["stored"]["id"] == exp["experiment"]["id"]
    approval = exp["approval"]
    assert approval["actor"].startswith("cli:") and approval["reason"] == "approved with --yes"
    assert "--max-running-requests" not in exp["final_args"]
    assert exp["final_args"][exp["final_args"].index("--chunked-prefill-size") + 1] == "4096"
    assert exp["final_value"] == {"max_running_requests": None}  # unset again
    assert exp["load"]["completed"] > 0
    assert code == 0
    missing = unknown_imports(tmp_path / "modules")
    assert missing == {}, "imported by kvpilot's tools, but neither in the GPU image nor the lock"


def test_the_oom_probe_and_an_ab_on_the_twin(tmp_path: Path) -> None:
    s = Settings(
        phases=("oom-probe", "ab"),
        port=free_port(),
        clients=16,
        probe_fractions=(0.95,),
        probe_s=10.0,
        probe_clients=8,
        ab_warmup_s=0.5,
        ab_steady_s=3.0,
        budget_s=1000,
    )
    code, found = run(tmp_path, s)
    probe = found["oom-probe.json"]
    assert probe["status"] == "ok" and probe["verdicts"] == {"0.95": "survived"}, probe
    (one,) = probe["probes"]
    assert len(one["samples"]) >= 3 and one["peak"]["sglang:token_usage"] > 0
    assert one["kvpilot"]["server"]["targets"]["0.85"]["predicted_max_total_num_tokens"] > 0
    assert one["load"]["sent"] > 0 and one["exit_code"] is None
    ab = found["ab.json"]
    assert ab["status"] == "ok" and set(ab["summaries"]) == {"a", "b"}
    assert (
        ab["summaries"]["b"]["max_total_num_tokens"] > ab["summaries"]["a"]["max_total_num_tokens"]
    )
    assert ab["summaries"]["a"]["samples"] >= 3 and "decode_tokens_per_s" in ab["compare"]
    side = ab["sides"]["a"]
    assert side["server_info"]["max_total_num_tokens"] == side["max_total_num_tokens"]
    assert all(s["metrics"]["v"] for s in side["samples"] if "error" not in s)
    assert code == 0


def unknown_imports(folder: Path) -> dict[str, list[str]]:
    """Top-level modules the recorded processes imported whose distribution the GPU machine
    would lack (neither in its image nor in the bundle's lock)."""
    recorded = [p.read_text().split() for p in folder.glob("*.txt")]
    assert len(recorded) >= 4  # server start, experiment, show, status, stop, the loads
    have = image.PACKAGES | {p.name for p in parse_lock(LOCK.read_text())}
    owners = importlib.metadata.packages_distributions()
    ours = {"bot", "playbooks", "storage", "sim", "tests", "sitecustomize"}
    missing: dict[str, list[str]] = {}
    for module in sorted({m for names in recorded for m in names}):
        if module in sys.stdlib_module_names or module in ours or module.startswith("_"):
            continue
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        if dists and not dists & have:
            missing[module] = sorted(dists)
    return missing


def test_a_whole_call_with_the_twin_for_sglang_and_a_fake_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run.main` as on the GPU machine, past its checks: the bundle unpacked, the carried
    compile caches restored and returned, the environment built, smoke run, every file in the
    results folder. Only the GPU (NVML), libnvrtc, nvcc, the Python version and the server
    (the twin) are stood in for."""
    gpu_dir = tmp_path / ".gpu"
    stage = tmp_path / "stage"
    (stage / "site").mkdir(parents=True)
    (stage / "model").mkdir()
    (stage / "BUNDLE.json").write_text(json.dumps({"format": 1, "packages": {}}))
    archive.write_archive(stage, gpu_dir / genv.BUNDLE_NAME, preset=1)
    kernels = tmp_path / "kernels"
    (kernels / "tvm-ffi" / "jit_kernel").mkdir(parents=True)
    (kernels / "tvm-ffi" / "jit_kernel" / "kernel.so").write_bytes(b"\x7fELF")
    archive.write_archive(kernels, gpu_dir / genv.CACHE_NAME, preset=1)
    nvrtc = tmp_path / "nvidia" / "cu13" / "lib"
    monkeypatch.setattr(gpu_source, "NvmlGpuReader", lambda: FakeGpuReader([H100]))
    monkeypatch.setattr(genv, "find_library", lambda name, roots: nvrtc)
    monkeypatch.setattr(genv, "find_nvcc", lambda path: Path("/usr/local/cuda/bin/nvcc"))
    monkeypatch.setattr(genv, "python_version", lambda: (3, 12, 3))
    monkeypatch.setattr(runner, "sglang_command", lambda python, model, f, extra: twin(f, extra))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.11.0+cu130")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the runner puts the bundle first
    out = tmp_path / "out"
    code = run_cli.main(
        [
            "--phases",
            "smoke",
            "--bundle",
            str(gpu_dir / genv.BUNDLE_NAME),
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(out),
            "--port",
            str(free_port()),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "bundle unpacked at" in printed and "compile caches: restored" in printed
    assert sorted(p.name for p in out.iterdir()) == [
        "jit-cache.tar.xz",
        "logs.tar.xz",
        "results.txt",
        "run.json",
        "smoke.json",
    ]
    with tarfile.open(out / genv.CACHE_NAME) as tar:
        assert "tvm-ffi/jit_kernel/kernel.so" in tar.getnames()
    with tarfile.open(out / "logs.tar.xz") as tar:
        names = tar.getnames()
    assert "00-runner.log" in names and any(n.endswith("sglang-0.4.log") for n in names)
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["gpu"]["name"] == H100.name and run_json["compile_cache"] == "restored"
    assert json.loads((out / "smoke.json").read_text())["status"] == "ok"
