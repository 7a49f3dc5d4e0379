"""The GPU runner's pure parts and its early failures, here, without a GPU: the plan within a
call's time, the command line, the environment, the configuration it writes for kvpilot, the
results it puts side by side, `--dry-run`, and the clear refusal on a machine that cannot run it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bot.app.config import load
from tests.real_gpu import archive, commands, env, plan, results, run
from tests.real_gpu.plan import Costs, Settings, make_plan
from tests.real_gpu.runner import prepare

FIRST_CALL = ("smoke", "capacity", "experiment-clear")

# ------------------------------------------------------------------------------------ plan


def test_the_first_calls_three_phases_fit_its_ten_minutes() -> None:
    p = make_plan(Settings(phases=FIRST_CALL), jit_cached=False, unpacked=False)
    assert [phase for phase, _ in p.steps] == list(FIRST_CALL) and p.skipped == ()
    assert p.total_s <= 585 < 600
    # smoke's server compiles the JIT kernels; capacity starts two servers, not three
    smoke, cap, _ = (t for _, t in p.steps)
    c = Costs()
    assert smoke == c.first_start_s + c.stop_s + c.smoke_requests_s + c.probe_s
    assert cap == 2 * (c.start_s + c.stop_s + c.probe_s)


def test_phases_run_in_their_order_whatever_order_they_are_given() -> None:
    s = Settings(phases=("ab", "capacity", "smoke"), ab_side="a", budget_s=5000)
    assert s.ordered == ("smoke", "capacity", "ab")


def test_capacity_alone_starts_every_fraction() -> None:
    s = Settings(phases=("capacity",))
    assert s.capacity_starts(False) == (0.40, 0.60, 0.85)
    assert s.capacity_starts(True) == (0.60, 0.85)
    p = make_plan(s, jit_cached=True, unpacked=True)
    assert p.steps == (("capacity", 3 * (Costs().start_s + Costs().stop_s + Costs().probe_s)),)


def test_a_phase_that_does_not_fit_is_skipped_with_the_reason() -> None:
    p = make_plan(Settings(phases=FIRST_CALL, budget_s=300), jit_cached=False, unpacked=False)
    assert [phase for phase, _ in p.steps] == ["smoke", "capacity"]
    [(phase, why)] = p.skipped
    assert phase == "experiment-clear" and "of the 300 s budget would be left" in why


def test_an_ab_of_two_five_minute_windows_is_split_into_two_calls() -> None:
    p = make_plan(Settings(phases=("ab",)), jit_cached=True, unpacked=True)
    [(phase, why)] = p.skipped
    assert phase == "ab" and "--ab-side a, then --ab-side b" in why
    one = make_plan(Settings(phases=("ab",), ab_side="a"), jit_cached=True, unpacked=True)
    assert one.skipped == () and one.steps[0][1] >= 300 + 60


def test_the_oom_probe_costs_a_start_and_its_load_per_fraction() -> None:
    s = Settings(phases=("oom-probe",), probe_fractions=(0.93, 0.95, 0.97, 0.95), probe_s=100)
    c = Costs()
    (step,) = make_plan(s, jit_cached=True, unpacked=True).steps
    per = c.start_s + c.stop_s + c.probe_s + c.ramp_s + 100 + c.drain_s
    assert step == ("oom-probe", 3 * per) and 3 * per < 585  # one call, the repeat not run


def test_the_experiment_changes_what_set_says_else_the_fraction() -> None:
    assert Settings(phases=("experiment",), target=0.7).experiment_change == (
        "mem_fraction_static=0.7"
    )
    s = Settings(phases=("experiment",), change="max_running_requests=48")
    assert s.experiment_change == "max_running_requests=48"
    p = make_plan(s, jit_cached=True, unpacked=True)
    clear = make_plan(Settings(phases=("experiment-clear",)), jit_cached=True, unpacked=True)
    assert p.steps[0][1] == clear.steps[0][1]


def test_the_trial_is_expected_to_end_at_the_gates_first_looks() -> None:
    gate = dict(plan.GATE_DEFAULTS)
    assert plan.trial_s(gate) == 20 + 3 * 10
    assert plan.trial_s({**gate, "max_trial_s": 40}) == 40


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"phases": ("smoke", "warmup")}, "unknown phase warmup"),
        ({"phases": ()}, "(none given)"),
        ({"phases": ("smoke",), "fraction": 1.2}, "between 0 and 1, got 1.2"),
        ({"phases": ("ab",), "ab_fractions": (0.4, 0.0)}, "between 0 and 1, got 0"),
        ({"phases": ("ab",), "ab_side": "c"}, "--ab-side must be one of a, b, both"),
        ({"phases": ("ab",), "clients": 0}, "must be positive"),
        ({"phases": ("experiment", "experiment-clear")}, "name one"),
        ({"phases": ("experiment",), "change": "max_running_requests"}, "takes KEY=VALUE"),
        ({"phases": ("experiment",), "change": "=48"}, "takes KEY=VALUE"),
        ({"phases": ("oom-probe",), "probe_fractions": (0.95, 1.0)}, "between 0 and 1, got 1"),
        ({"phases": ("oom-probe",), "probe_s": 5}, "at least 10 s"),
        ({"phases": ("oom-probe",), "probe_clients": 0}, "must be positive"),
        ({"phases": ("ab",), "ab_profile": "chat"}, "unknown workload profile 'chat'"),
        (
            {"phases": ("ab",), "ab_profile": "uniform", "ab_profile_options": ("users=4",)},
            "has no option users",
        ),
        (
            {
                "phases": ("ab",),
                "ab_profile": "conversations",
                "ab_profile_options": ("conversations=100",),
            },
            "--clients 150 is more than profile 'conversations' serves at once",
        ),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ command line


def test_command_line_options_become_settings() -> None:
    ns = run.build_parser().parse_args(
        [
            "--phases",
            "smoke, ab",
            "--capacity-fractions",
            "0.5,0.7",
            "--gate",
            "baseline_s=48,batch_s=8",
            "--ab-fractions",
            "0.4,0.9",
            "--ab-extra-b",
            "--enable-hierarchical-cache --hicache-ratio 2",
            "--ab-side",
            "b",
            "--set",
            "max_running_requests=48",
            "--start-extra",
            "--max-running-requests 200",
            "--probe-fractions",
            "0.9,0.96",
            "--probe-s",
            "60",
            "--probe-clients",
            "120",
            "--ab-profile",
            "working-set",
            "--ab-profile-option",
            "working_set_tokens=200_000",
        ]
    )
    s = run.settings_of(ns)
    assert (s.ab_profile, s.ab_profile_options) == ("working-set", ("working_set_tokens=200_000",))
    assert s.change == "max_running_requests=48"
    assert s.start_extra == ("--max-running-requests", "200")
    assert (s.probe_fractions, s.probe_s, s.probe_clients) == ((0.9, 0.96), 60.0, 120)
    assert s.phases == ("smoke", "ab")
    assert s.capacity_fractions == (0.5, 0.7)
    assert s.gate == {**plan.GATE_DEFAULTS, "baseline_s": 48.0, "batch_s": 8.0}
    assert s.ab_fractions == (0.4, 0.9) and s.ab_runs == ("b",)
    assert s.ab_extra == ((), ("--enable-hierarchical-cache", "--hicache-ratio", "2"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gate", "baseline=60"], "--gate takes KEY=SECONDS pairs"),
        (["--gate", "batch_s=ten"], "not a number"),
        (["--capacity-fractions", "0.4,x"], "expected fractions like 0.40,0.85"),
    ],
)
def test_bad_options_are_refused_by_the_parser(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        run.build_parser().parse_args(["--phases", "smoke", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_results_go_to_out_then_to_gpu_results(tmp_path: Path) -> None:
    assert run.out_dir(tmp_path, {"OUT": "/elsewhere"}) == tmp_path
    assert run.out_dir(None, {"OUT": "/device/out"}) == Path("/device/out")
    assert run.out_dir(None, {}) == run.REPO / "gpu-results"


def test_dry_run_prints_the_plan_and_every_command_without_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run.main(
        [
            "--phases",
            "smoke,capacity,experiment-clear",
            "--dry-run",
            "--bundle",
            str(tmp_path / "absent.tar.xz"),
            "--work",
            str(tmp_path / "work"),
            "--port",
            "31000",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "smoke: about 103 s" in out and "total about 576 s" in out
    servers = [line for line in out.splitlines() if "would run: python3 -m sglang" in line]
    assert len(servers) == 3  # smoke's and capacity's two; kvpilot.toml holds the fourth
    assert all(
        "--load-format dummy --attention-backend triton --sampling-backend pytorch "
        "--enable-metrics" in line
        for line in servers
    )
    assert "--mem-fraction-static 0.6 --host 127.0.0.1 --port 31000" in out
    assert "python3 -m bot.cli experiment --server gpu --set mem_fraction_static=0.82 --yes" in out
    assert "--profile uniform" in out and "--concurrency 150" in out
    assert "SGLANG_IS_FLASHINFER_AVAILABLE=false" in out and "TVM_FFI_CACHE_DIR=" in out
    assert 'kind = "process"' in out and "baseline_s = 60" in out
    assert '"--mem-fraction-static", "0.4", "--host", "127.0.0.1", "--port", "31000"]' in out
    assert not (tmp_path / "work").exists()  # nothing unpacked, nothing started


def test_dry_run_of_any_change_and_the_oom_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run.main(
        [
            *("--phases", "experiment,oom-probe", "--dry-run", "--budget-s", "1200"),
            *("--fraction", "0.82", "--set", "max_running_requests=48"),
            *("--start-extra", "--chunked-prefill-size 4096", "--probe-fractions", "0.93,0.97"),
            *("--bundle", str(tmp_path / "absent.tar.xz"), "--work", str(tmp_path / "work")),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "SKIPPED" not in out
    assert "experiment --server gpu --set max_running_requests=48 --yes" in out
    assert '"--mem-fraction-static", "0.82", "--chunked-prefill-size", "4096", "--host"' in out
    probes = [line for line in out.splitlines() if "--profile long-context" in line]
    assert len(probes) == 2 and all("--concurrency 200" in line for line in probes)
    assert "--mem-fraction-static 0.97 --host" in out


def test_an_unsafe_change_is_run_only_when_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        *("--phases", "experiment", "--dry-run", "--set", "mem_fraction_static=0.99"),
        *("--bundle", str(tmp_path / "absent.tar.xz"), "--work", str(tmp_path / "work")),
    ]
    assert run.main(common) == 0
    assert "--set mem_fraction_static=0.99 --yes --json" in capsys.readouterr().out
    assert run.main([*common, "--force"]) == 0
    assert "--set mem_fraction_static=0.99 --yes --force --json" in capsys.readouterr().out


def test_a_machine_that_cannot_run_it_is_told_why_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Here: Python 3.11, no torch, no bundle; each named with its fix, exit status 3."""
    code = run.main(
        [
            "--phases",
            "smoke",
            "--bundle",
            str(tmp_path / "absent.tar.xz"),
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert code == run.EXIT_ENVIRONMENT
    assert "error: python 3.11" in out and "use the GPU image's python3" not in out
    assert "run with the GPU image's python3 (Python 3.12" in out
    assert f"error: no bundle at {tmp_path / 'absent.tar.xz'}" in out and "make gpu-bundle" in out
    assert "stopping: fix the errors above (nothing was started)" in out
    assert not (tmp_path / "out").exists()


def test_no_gpu_is_said_before_the_bundle_is_unpacked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = run.build_parser().parse_args(
        ["--phases", "smoke", "--bundle", str(tmp_path / "b.tar.xz"), "--work", str(tmp_path)]
    )
    code = prepare(ns, run.settings_of(ns), tmp_path / "out", print, 0.0, run.REPO)
    out = capsys.readouterr().out
    assert code == 3
    assert "error: no NVIDIA GPU visible (" in out and "run on the GPU machine" in out
    assert not list(tmp_path.glob("bundle-*"))


# ------------------------------------------------------------------------------ environment


def test_servers_and_tools_get_the_bundle_flashinfer_off_and_the_caches(tmp_path: Path) -> None:
    base = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "PYTHONPATH": "/x", "HOME": "/r"}
    common = {
        "site": Path("/t/site"),
        "cache": Path("/t/cache"),
        "nvrtc_dir": Path("/py/nvidia/cu13/lib"),
        "nvcc": Path("/usr/local/cuda/bin/nvcc"),
    }
    server = env.runtime_env(base, **common)
    tools = env.runtime_env(base, **common, repo=Path("/repo"))
    assert server["PYTHONPATH"] == "/t/site:/x" and tools["PYTHONPATH"] == "/t/site:/repo:/x"
    assert server["LD_LIBRARY_PATH"] == "/py/nvidia/cu13/lib:/opt/lib"
    assert (
        server["PATH"] == "/usr/local/cuda/bin:/usr/bin"
        and server["CUDA_HOME"] == "/usr/local/cuda"
    )
    assert server["SGLANG_IS_FLASHINFER_AVAILABLE"] == "false"
    assert server["TVM_FFI_CACHE_DIR"] == "/t/cache/tvm-ffi"
    assert server["TRITON_CACHE_DIR"] == "/t/cache/triton"
    assert server["HF_HUB_OFFLINE"] == "1" and server["NCCL_NVLS_ENABLE"] == "0"
    assert base["PYTHONPATH"] == "/x"  # the caller's mapping is left as it was
    bare = env.runtime_env({}, site=Path("/s"), cache=Path("/c"), nvrtc_dir=None, nvcc=None)
    assert "LD_LIBRARY_PATH" not in bare and "CUDA_HOME" not in bare


def test_libnvrtc_is_found_in_the_pythons_cuda_wheels(tmp_path: Path) -> None:
    lib = tmp_path / "site-packages" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.13").write_bytes(b"")
    assert env.find_library(env.NVRTC, [tmp_path / "elsewhere", tmp_path / "site-packages"]) == lib
    assert env.find_library("libcublas.so.13", [tmp_path / "site-packages"]) is None


def test_the_bundle_is_unpacked_once_per_archive(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    (stage / "site").mkdir(parents=True)
    (stage / "site" / "mod.py").write_text("X = 1\n")
    (stage / "BUNDLE.json").write_text("{}\n")
    bundle = tmp_path / env.BUNDLE_NAME
    archive.write_archive(stage, bundle, preset=1)
    first, reused = env.unpack(bundle, tmp_path / "work")
    assert not reused and (first / "site" / "mod.py").read_text() == "X = 1\n"
    again, reused = env.unpack(bundle, tmp_path / "work")
    assert reused and again == first
    assert [p.name for p in (tmp_path / "work").iterdir()] == [first.name]


def test_compile_caches_come_from_the_carried_archive_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    carried = tmp_path / env.CACHE_NAME
    assert env.restore_cache(carried, cache) == "empty"
    (cache / "triton" / "k").mkdir(parents=True)
    (cache / "triton" / "k" / "kernel.cubin").write_bytes(b"\1\2")
    assert env.pack_cache(cache, carried) is not None
    with tarfile.open(carried) as tar:
        assert "triton/k/kernel.cubin" in tar.getnames()
    assert env.restore_cache(carried, cache) == "kept"
    fresh = tmp_path / "fresh"
    assert env.restore_cache(carried, fresh) == "restored"
    assert (fresh / "triton" / "k" / "kernel.cubin").read_bytes() == b"\1\2"
    assert env.pack_cache(tmp_path / "nothing", tmp_path / "x.tar.xz") is None


@pytest.mark.parametrize(
    ("check", "ok", "text"),
    [
        (env.check_python((3, 12, 3)), True, "ok: python 3.12.3"),
        (env.check_python((3, 11, 7)), False, "error: python 3.11.7: the bundle holds cp312"),
        (env.check_torch("2.11.0+cu130"), True, "ok: torch 2.11.0+cu130"),
        (env.check_torch("2.13.0"), False, "needs torch 2.11.0"),
        (env.check_torch(None), False, "torch is not installed"),
        (env.check_library("libnvrtc.so.13", None), False, "not found under this python's"),
        (env.check_nvcc(None, cache_ready=True), True, "warning: no nvcc"),
        (env.check_nvcc(None, cache_ready=False), False, "error: no nvcc"),
        (env.check_gpus([], "NVML could not start"), False, "no NVIDIA GPU visible (NVML"),
    ],
)
def test_each_check_says_what_is_wrong_and_the_fix(check: env.Check, ok: bool, text: str) -> None:
    assert (check.ok or not check.fatal) == ok
    assert text in check.line()


def test_a_taken_port_is_named(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert "pass another --port" in env.check_port(port).line()


def test_a_port_a_stopped_server_left_in_time_wait_is_free(tmp_path: Path) -> None:
    """On the GPU machine the call after a server's stop was refused "port 30000 is taken"
    with nothing listening: the server had closed its connections first (TIME_WAIT). SGLang's
    server binds with SO_REUSEADDR, as the check now does."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server's side closes first and holds the port in TIME_WAIT
        client.recv(1)
        client.close()
    assert env.check_port(port).ok, env.check_port(port).line()


# --------------------------------------------------------------------------- kvpilot's config


def test_the_experiments_configuration_is_one_kvpilot_accepts(tmp_path: Path) -> None:
    command = commands.sglang_command("/usr/bin/python3", Path("/m"), 0.4)
    text = commands.kvpilot_config(
        "http://127.0.0.1:30000",
        [*command, "--host", "127.0.0.1", "--port", "30000"],
        {"PYTHONPATH": "/tmp/kvpilot-gpu/b/site"},
        plan.GATE_DEFAULTS,
        local_gpus=True,
    )
    path = tmp_path / "kvpilot.toml"
    path.write_text(text)
    config = load(str(path))
    server = config.server("gpu")
    assert server.local_gpus and server.engine == "sglang"
    assert server.launcher is not None and server.launcher.kind == "process"
    assert server.launcher.command[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
    assert server.launcher.env == {"PYTHONPATH": "/tmp/kvpilot-gpu/b/site"}
    assert (server.gate.baseline_s, server.gate.batch_s, server.gate.max_trial_s) == (60, 10, 90)
    assert config.database == tmp_path / "kvpilot.db" and config.time_scale == 1.0


# ---------------------------------------------------------------------------------- results


def _server(fraction: float, real: int, predicted: dict[str, int]) -> dict[str, object]:
    targets = {
        k: {"predicted_max_total_num_tokens": v, "verdict": "safe"} for k, v in predicted.items()
    }
    return {
        "fraction": fraction,
        "max_total_num_tokens": real,
        "predictions": {"server": {"targets": targets, "model": {}}, "nvml": {"targets": {}}},
    }


def test_capacity_predictions_are_held_against_what_each_fraction_got() -> None:
    servers = [
        _server(0.4, 133_847, {"0.6": 260_000, "0.82": 400_000}),
        _server(0.6, 262_579, {"0.4": 135_000}),
    ]
    rows = results.capacity_rows(servers)
    assert [(r["from"], r["to"], r["real"], r["server"]) for r in rows] == [
        (0.4, 0.6, 262_579, 260_000),
        (0.4, 0.82, None, 400_000),
        (0.6, 0.4, 133_847, 135_000),
    ]
    assert rows[0]["server_error"] == pytest.approx(260_000 / 262_579 - 1, abs=1e-5)
    assert rows[1]["server_error"] is None and rows[0]["nvml"] is None
    table = results.capacity_table(servers)
    assert "0.4   0.6   262,579      260,000 (-1.0%)                    -" in table
    assert "0.4  0.82         -              400,000" in table


def test_the_decode_rate_comes_from_the_counter_where_exported() -> None:
    counted = [
        {"t": 0.0, "decoded_tokens": 1000.0, "decode_rate": 9.0},
        {"t": 10.0, "decoded_tokens": 43_000.0, "decode_rate": 9.0},
    ]
    assert results.decode_rate(counted) == (4200.0, "realtime_tokens_total{mode=decode}")
    gauges = [{"t": 0.0, "decode_rate": 4000.0}, {"t": 5.0, "decode_rate": 4400.0}]
    assert results.decode_rate(gauges) == (4200.0, "gen_throughput (mean)")
    assert results.decode_rate([]) == (None, "none")


def test_the_client_rate_counts_requests_finished_inside_the_window() -> None:
    finished = [(1.0, 1000), (5.0, 2000), (9.0, 3000), (12.0, 4000)]
    assert results.client_rate(finished, 100.0, 104.0, 110.0) == (5000 / 6, 2)


def _side(fraction: float, decode: float, gpu: str) -> dict[str, object]:
    return {
        "fraction": fraction,
        "gpu": {"name": gpu},
        "window": [100.0, 400.0],
        "samples": [
            {"t": 90.0, "decoded_tokens": 0.0, "running": 10, "queued": 0, "preemptions": 0},
            {"t": 100.0, "decoded_tokens": 0.0, "running": 57, "queued": 93, "preemptions": 2},
            {
                "t": 400.0,
                "decoded_tokens": decode * 300,
                "running": 57,
                "queued": 93,
                "preemptions": 33,
            },
        ],
        "load": {"started_at": 50.0, "finished": [[40.0, 2500], [200.0, 3000], [300.0, 1500]]},
    }


def test_an_ab_over_two_calls_is_compared_and_a_gpu_change_is_flagged(tmp_path: Path) -> None:
    a = _side(0.4, 4211.0, "NVIDIA H100 80GB HBM3")
    b = _side(0.85, 6228.0, "NVIDIA H200")
    for name, side in (("one", ("a", a)), ("two", ("b", b))):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"ab-{side[0]}.json").write_text(json.dumps({"sides": dict([side])}))
    found = results.load_dirs([tmp_path / "one", tmp_path / "two"])
    summary = results.side_summary(a)
    assert summary["decode_tokens_per_s"] == 4211.0 and summary["retractions"] == 31
    assert summary["running"] == 57 and summary["client_tokens_per_s"] == 15.0
    text = results.render(found)
    assert "B against A: decode +47.9%" in text and "different GPUs" in text


def _counted(rate: float, wobble: float, n: int = 61) -> list[dict[str, float]]:
    """Readings 5 s apart of a decode counter growing at `rate`, batch by batch +-`wobble`."""
    out, total = [], 0.0
    for i in range(n):
        out.append({"t": 1000.0 + 5 * i, "decoded_tokens": total})
        total += 5 * rate * (1 + (wobble if (i // 3) % 2 else -wobble))
    return out


def test_a_long_ab_says_its_difference_with_an_interval_from_batches() -> None:
    """Five minutes a side in 15 s batches: 20 batch rates each, their spread the interval."""
    a = results.rate_spread(results.batch_rates(_counted(4000.0, 0.05)))
    b = results.rate_spread(results.batch_rates(_counted(5000.0, 0.05)))
    assert a is not None and b is not None and a["batches"] == 20
    assert a["mean"] == pytest.approx(4000, rel=0.01) and a["first_half"] == a["second_half"]
    diff = results.relative_interval(a, b)
    assert diff is not None
    mean, low, high = diff
    assert mean == pytest.approx(0.25, abs=0.005) and low < 0.25 < high and high - low < 0.1
    # steadier sides, a narrower interval; too few batches, none
    calm = results.relative_interval(
        results.rate_spread(results.batch_rates(_counted(4000.0, 0.01))),
        results.rate_spread(results.batch_rates(_counted(5000.0, 0.01))),
    )
    assert calm is not None and calm[2] - calm[1] < (high - low) / 3
    assert results.rate_spread(results.batch_rates(_counted(4000.0, 0.0, n=10))) is None


def test_at_most_eight_files_come_back() -> None:
    # a call's own four files (run.json, results.txt, the logs, the caches) and a file per phase
    assert results.OUT_LIMIT == 8 and plan.MAX_PHASES == 8 - 4
    with pytest.raises(ValueError, match="at most 4 phases a call"):
        Settings(phases=("smoke", "capacity", "experiment", "oom-probe", "ab"))
    assert results.ab_file("both") == "ab.json" and results.ab_file("a") == "ab-a.json"


def test_results_command_prints_the_table_of_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "smoke.json").write_text(
        json.dumps(
            {
                "status": "ok",
                "server": {
                    "version": "0.5.17",
                    "startup_s": 41,
                    "fraction": 0.4,
                    "max_total_num_tokens": 133847,
                },
                "requests": [{}] * 5,
                "metric_families": ["sglang:x"] * 88,
            }
        )
    )
    assert results.main([str(tmp_path)]) == 0
    assert "smoke: ok; SGLang 0.5.17 started in 41 s" in capsys.readouterr().out
    assert results.main([str(tmp_path / "missing")]) == 2


def test_the_runner_imports_nothing_beyond_the_standard_library_before_its_checks() -> None:
    """`run.py` must start where only the image's python is: its checks come first. (It reads
    the load profiles' names and options from `sim.workload`, which is standard library only.)"""
    code = (
        "import sys; before = set(sys.modules); import tests.real_gpu.run; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new - set(sys.stdlib_module_names) - {'tests', 'sim'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=run.REPO,
        env={**os.environ, "PYTHONPATH": str(run.REPO)},
    ).stdout
    assert out.strip() == "[]"


def _sleeper(*args: str, start_new_session: bool = False) -> subprocess.Popen[str]:
    """A child that has surely run Python: until it execs, /proc shows the forking pytest's
    command line, which is what made a check read a moment after `Popen` see no server."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)", *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=start_new_session,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


def test_a_server_an_earlier_cut_off_call_left_running_is_stopped(tmp_path: Path) -> None:
    """kvpilot's launcher starts SGLang in its own session, which outlives a call killed at its
    limit; the next call on the same machine stops it before checking the port."""
    leftover = _sleeper("sglang.launch_server", start_new_session=True)
    unrelated = _sleeper()
    try:
        state = tmp_path / "calls" / "20261206-010000" / "experiment" / "state"
        state.mkdir(parents=True)
        (state / "gpu.process.json").write_text(json.dumps({"pid": leftover.pid}))
        (state / "other.process.json").write_text(json.dumps({"pid": unrelated.pid}))
        (state / "gone.process.json").write_text(json.dumps({"pid": 2**22 + 7}))
        assert env.stop_leftovers(tmp_path) == [leftover.pid]
        assert leftover.wait(10) == -9
        assert unrelated.poll() is None  # not a server: left alone
        assert env.stop_leftovers(tmp_path) == []
    finally:
        for proc in (leftover, unrelated):
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


def test_the_table_of_a_call_whose_smoke_failed() -> None:
    found: dict[str, dict[str, object]] = {
        "run.json": {
            "gpu": None,
            "ran": [{"phase": "smoke", "status": "failed", "seconds": 31.0}],
            "skipped": [["capacity", "smoke failed"]],
        },
        "smoke.json": {"status": "failed", "error": "SGLang exited with code 1"},
    }
    text = results.render(found)
    assert "GPU call: ?; phases smoke failed (31 s); capacity skipped: smoke failed" in text
    assert "smoke: failed: SGLang exited with code 1" in text
