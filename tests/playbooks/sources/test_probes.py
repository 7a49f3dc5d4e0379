"""GPU and host probes: recordings from a real H200 host, and NVML driven through a fake."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from playbooks.engines.sglang.client import parse_server_info
from playbooks.engines.sglang.rules import resolve_gpu_memory
from playbooks.engines.types import DiagnoseSettings
from playbooks.sources.gpu import FakeGpuReader, GpuUnavailable, NvmlGpuReader
from playbooks.sources.host import ConfiguredHost, HostUnavailable, MeminfoReader, parse_meminfo
from tests import paths
from tests.playbooks.diagnose.recorded import FIXTURES

GPU = paths.FIXTURES / "gpu"


def test_h200_recordings() -> None:
    for name in ("h200-probe.json", "nvml-h200.json"):
        (gpu,) = FakeGpuReader.from_recording(GPU / name).snapshot()
        assert gpu.name == "NVIDIA H200"
        assert gpu.memory_total_mib == 143_771  # what nvidia-smi printed on that machine
        assert gpu.memory_free_bytes // (1 << 20) in (143_155, 143_156)


class FakeNvml:
    """The pynvml calls the reader makes, answering like one idle H200."""

    class NVMLError(Exception):
        pass

    def __init__(self, count: int = 1, fail_init: bool = False) -> None:
        self.count = count
        self.fail_init = fail_init
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=150_754_820_096, used=644_939_776, free=150_109_880_320)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=3, memory=1)

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}"


def test_nvml_reader() -> None:
    nvml = FakeNvml(count=8)
    gpus = NvmlGpuReader(nvml).snapshot()
    assert len(gpus) == 8 and gpus[3].uuid == "GPU-3" and gpus[0].utilization_gpu_pct == 3
    assert nvml.shutdowns == 1
    with pytest.raises(GpuUnavailable, match="could not start"):
        NvmlGpuReader(FakeNvml(fail_init=True)).snapshot()
    with pytest.raises(GpuUnavailable, match="no GPU"):
        NvmlGpuReader(FakeNvml(count=0)).snapshot()


def test_gpu_memory_from_nvml_when_local() -> None:
    info = parse_server_info(
        json.loads((FIXTURES / "twin-0.5.10" / "server_info.json").read_text())
    )
    gpu, notes = resolve_gpu_memory(info, DiagnoseSettings(gpus=NvmlGpuReader(FakeNvml())))
    # at TP8 SGLang measures after its communicators take their share: NVML is an upper bound
    assert gpu is not None and not gpu.exact and info.tp_size == 8
    assert any("overstates" in note for note in notes)
    assert gpu.pre_gib == pytest.approx(150_754_820_096 / (1 << 30) - 0.5)
    assert "NVIDIA H200" in gpu.source
    gpu, notes = resolve_gpu_memory(
        info, DiagnoseSettings(gpus=NvmlGpuReader(FakeNvml(fail_init=True)))
    )
    assert gpu is None and "GPU probe unavailable" in notes[0]


def test_host_memory() -> None:
    mem = parse_meminfo((GPU / "meminfo.txt").read_text())
    assert mem.total_bytes == 131_981_020 * 1024
    assert mem.available_bytes == 131_508_496 * 1024
    assert MeminfoReader().memory().total_bytes > 0  # this machine's own
    with pytest.raises(HostUnavailable):
        MeminfoReader(Path("/nonexistent/meminfo")).memory()
    with pytest.raises(HostUnavailable, match="MemTotal"):
        parse_meminfo("nothing here")
    assert ConfiguredHost(256).memory().total_gib == 256
    with pytest.raises(ValueError, match="positive"):
        ConfiguredHost(0)
