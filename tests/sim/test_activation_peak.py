"""The twin's hidden activation peak: a true peak above the modelled one, which the server
never reports, and which kills it under load with CUDA's out-of-memory error."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from sim.args import resolve
from sim.engine import GpuOutOfMemory
from sim.flags import PEAK_SCALE_ENV, PEAK_SCALE_FLAG
from sim.memory import activation_need_gib, headroom, modelled_activation_gib
from sim.presets import KIMI_INCIDENT
from sim.simulate import simulate
from tests.twin_process import running_twin, spawn

INCIDENT = ["--mem-fraction-static", "0.85"]
# At 0.85 the incident leaves 12.30 GiB for activations; a full 8192-token chunk is modelled
# at 5.01 GiB, so the true peak may be up to 2.45x the model before it dies.
FITS, DIES = 2.4, 2.5
ODD = 2.5123  # a value no report would print by chance


def test_default_is_the_model() -> None:
    cfg = resolve(INCIDENT)
    assert cfg.preset.memory.activation_peak_scale == 1.0
    assert activation_need_gib(cfg.preset, 8192) == modelled_activation_gib(cfg.preset, 8192)


def test_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve([*INCIDENT, PEAK_SCALE_FLAG, "1.7"]).preset.memory.activation_peak_scale == 1.7
    monkeypatch.setenv(PEAK_SCALE_ENV, "1.3")
    assert resolve(INCIDENT).preset.memory.activation_peak_scale == 1.3
    assert resolve([*INCIDENT, PEAK_SCALE_FLAG, "1.7"]).preset.memory.activation_peak_scale == 1.7
    monkeypatch.setenv(PEAK_SCALE_ENV, "-1")
    with pytest.raises(SystemExit) as exc:
        resolve(INCIDENT)
    assert exc.value.code == 2


def test_the_true_need_scales_the_model() -> None:
    cfg = resolve([*INCIDENT, PEAK_SCALE_FLAG, "2"])
    need = activation_need_gib(cfg.preset, 8192)
    assert need == pytest.approx(2 * modelled_activation_gib(KIMI_INCIDENT, 8192))
    room = headroom(cfg.preset, 0.85, False).activation_gib
    assert room == headroom(KIMI_INCIDENT, 0.85, False).activation_gib  # memory itself is as was
    assert cfg.failure is None  # start-up is unchanged: the peak shows under load


def test_a_peak_that_fits_runs_and_one_that_does_not_dies_under_load() -> None:
    ok = simulate(
        [*INCIDENT, PEAK_SCALE_FLAG, str(FITS)], profile="incident", concurrency=150, duration=120
    )
    assert ok.completed_tokens >= 0
    with pytest.raises(GpuOutOfMemory, match=r"^CUDA out of memory\. Tried to allocate"):
        simulate(
            [*INCIDENT, PEAK_SCALE_FLAG, str(DIES)],
            profile="incident",
            concurrency=150,
            duration=120,
        )


def test_largest_batches_are_recorded() -> None:
    from sim.engine import Engine  # noqa: PLC0415
    from sim.simulate import engine_config  # noqa: PLC0415

    engine = Engine(engine_config(resolve(INCIDENT)))
    engine.batch_records.clear()
    engine._check_activation(100)
    engine._check_activation(50)
    engine.now = 3.0
    engine._check_activation(8192)
    assert engine.batch_records == [(0.0, 100), (3.0, 8192)]


def test_the_server_does_not_report_it() -> None:
    args = ["--time-scale", "2000", "--enable-metrics", "--sglang-version", "0.5.23", *INCIDENT]
    with running_twin([*args, PEAK_SCALE_FLAG, str(ODD)]) as twin:
        info = httpx.get(twin.url + "/server_info", timeout=5).json()
        metrics = httpx.get(twin.url + "/metrics", timeout=5).text
        log = twin.log()
    text = json.dumps(info)
    assert PEAK_SCALE_FLAG not in info["launch_command"]
    assert "--mem-fraction-static 0.85" in info["launch_command"]
    for where in (text, metrics, log):
        assert str(ODD) not in where
        assert "peak_scale" not in where.lower().replace("-", "_")


def test_the_twin_dies_with_cudas_error_under_load() -> None:
    twin = spawn(
        [
            "--time-scale",
            "2000",
            *INCIDENT,
            PEAK_SCALE_FLAG,
            str(DIES),
            "--workload",
            "incident",
            "--concurrency",
            "150",
        ]
    )
    try:
        code = twin.wait_exit(timeout=60)
        log = twin.log()
    finally:
        twin.stop()
        twin.log_path.unlink(missing_ok=True)
    assert "The server is fired up and ready to roll!" in log
    assert "torch.OutOfMemoryError: CUDA out of memory." in log
    assert code == -signal.SIGKILL
