"""GPU state behind a small protocol; NVML (pynvml) is the only real implementation.

The bot reads GPUs directly only when it runs on the GPU host. Elsewhere GPU memory comes from
SGLang's server info and from configuration, and `FakeGpuReader` serves tests. Running this module
prints what NVML reports, as JSON:

    python -m playbooks.sources.gpu
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MIB = 1 << 20


class GpuUnavailable(Exception):
    """NVML is missing or reports no GPU (no driver, no device, container without access)."""


@dataclass(frozen=True)
class GpuState:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    utilization_gpu_pct: int | None
    utilization_memory_pct: int | None

    @property
    def memory_total_mib(self) -> int:
        """What `nvidia-smi --query-gpu=memory.total` prints (SGLang's defaults use it)."""
        return self.memory_total_bytes // MIB

    @property
    def memory_total_gib(self) -> float:
        return self.memory_total_bytes / (1 << 30)

    @property
    def memory_free_gib(self) -> float:
        return self.memory_free_bytes / (1 << 30)


class GpuReader(Protocol):
    def snapshot(self) -> list[GpuState]: ...


class FakeGpuReader:
    """Serves fixed states, e.g. from a recording of a real machine."""

    def __init__(self, states: list[GpuState]) -> None:
        self.states = states

    def snapshot(self) -> list[GpuState]:
        return list(self.states)

    @classmethod
    def from_recording(cls, path: Path) -> FakeGpuReader:
        """Load the JSON that `python -m playbooks.sources.gpu` printed on a real machine."""
        data = json.loads(path.read_text())
        states = []
        for gpu in data["gpus"]:
            util = gpu.get("utilization") or {}
            mem = gpu["memory"]
            states.append(
                GpuState(
                    index=int(gpu["index"]),
                    name=str(gpu["name"]),
                    uuid=str(gpu.get("uuid", "")),
                    memory_total_bytes=int(mem["total"]),
                    memory_used_bytes=int(mem["used"]),
                    memory_free_bytes=int(mem["free"]),
                    utilization_gpu_pct=util.get("gpu"),
                    utilization_memory_pct=util.get("memory"),
                )
            )
        return cls(states)


class NvmlGpuReader:
    """Reads every visible GPU through NVML; initialises and shuts NVML down per snapshot."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml

    def _lib(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415  (optional at import time: most hosts have no GPU)
            except ImportError as exc:  # pragma: no cover - the package is a dependency
                raise GpuUnavailable("the nvidia-ml-py package is not installed") from exc
            self._nvml = pynvml
        return self._nvml

    def snapshot(self) -> list[GpuState]:
        nvml = self._lib()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML could not start: {exc}") from exc
        try:
            states = []
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpu_pct: int | None = None
                mem_pct: int | None = None
                try:
                    util = nvml.nvmlDeviceGetUtilizationRates(handle)
                    gpu_pct, mem_pct = int(util.gpu), int(util.memory)
                except nvml.NVMLError:
                    pass
                name = nvml.nvmlDeviceGetName(handle)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                states.append(
                    GpuState(
                        index=i,
                        name=name.decode() if isinstance(name, bytes) else str(name),
                        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                        memory_total_bytes=int(mem.total),
                        memory_used_bytes=int(mem.used),
                        memory_free_bytes=int(mem.free),
                        utilization_gpu_pct=gpu_pct,
                        utilization_memory_pct=mem_pct,
                    )
                )
            if not states:
                raise GpuUnavailable("NVML reports no GPU")
            return states
        finally:
            nvml.nvmlShutdown()


def recording(states: list[GpuState]) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "index": s.index,
                "name": s.name,
                "uuid": s.uuid,
                "memory": {
                    "total": s.memory_total_bytes,
                    "used": s.memory_used_bytes,
                    "free": s.memory_free_bytes,
                },
                "utilization": {"gpu": s.utilization_gpu_pct, "memory": s.utilization_memory_pct},
                "memory_total_mib": s.memory_total_mib,
            }
            for s in states
        ]
    }


def main() -> int:
    try:
        states = NvmlGpuReader().snapshot()
    except GpuUnavailable as exc:
        print(f"no GPU: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(recording(states), indent=1))
    for s in states:
        print(
            f"GPU {s.index}: {s.name}, {s.memory_total_mib} MiB total, "
            f"{s.memory_free_bytes // MIB} MiB free",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
