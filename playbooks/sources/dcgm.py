"""GPU memory from DCGM exporter series in Prometheus, when the GPUs cannot be asked directly.

DCGM reports frame-buffer memory in MiB (`DCGM_FI_DEV_FB_USED` + `DCGM_FI_DEV_FB_FREE`
[+ `DCGM_FI_DEV_FB_RESERVED`]); their sum is what `nvidia-smi` calls the total.
"""

from __future__ import annotations

import math

from playbooks.sources.gpu import MIB, GpuState, GpuUnavailable
from playbooks.sources.prometheus_api import PrometheusAPI, PrometheusError, parse_selector

DCGM_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_RESERVED = "DCGM_FI_DEV_FB_RESERVED"


def _gpu_key(labels: dict[str, str]) -> tuple[str, str, str]:
    return (
        labels.get("Hostname", labels.get("instance", "")),
        labels.get("gpu", ""),
        labels.get("UUID", ""),
    )


class DcgmGpuReader:
    """GPU memory from DCGM exporter series in Prometheus (a `GpuReader`).

    DCGM reports frame-buffer memory in MiB: used, free and (on newer drivers) reserved, which
    add up to what `nvidia-smi` calls the total.
    """

    def __init__(self, api: PrometheusAPI, selector: str) -> None:
        try:
            self.matchers = parse_selector(selector)
        except ValueError as exc:
            raise PrometheusError(str(exc)) from None
        self.api = api
        self.selector = "{" + self.matchers + "}"

    def snapshot(self) -> list[GpuState]:
        try:
            used = self.api.query(f"{DCGM_USED}{self.selector}")
            free = self.api.query(f"{DCGM_FREE}{self.selector}")
            reserved = self.api.query(f"{DCGM_RESERVED}{self.selector}")
        except PrometheusError as exc:
            raise GpuUnavailable(f"DCGM metrics unavailable: {exc}") from None
        if not used or not free:
            missing = DCGM_USED if not used else DCGM_FREE
            raise GpuUnavailable(
                f"Prometheus at {self.api.base_url} has no {missing}{self.selector} series "
                "(is dcgm-exporter running and scraped, and does the DCGM selector match?)"
            )
        free_by = {_gpu_key(s.labels): s.value for s in free}
        reserved_by = {_gpu_key(s.labels): s.value for s in reserved}
        states: list[GpuState] = []
        for s in sorted(used, key=lambda x: (_gpu_key(x.labels), x.labels.get("gpu", ""))):
            key = _gpu_key(s.labels)
            if key not in free_by:
                raise GpuUnavailable(f"DCGM reports used but not free memory for GPU {key}")
            used_mib, free_mib = s.value, free_by[key]
            total_mib = used_mib + free_mib + reserved_by.get(key, 0.0)
            if any(math.isnan(v) or v < 0 for v in (used_mib, free_mib, total_mib)):
                raise GpuUnavailable(f"DCGM reports no valid frame-buffer sizes for GPU {key}")
            gpu = s.labels.get("gpu", "")
            states.append(
                GpuState(
                    index=int(gpu) if gpu.isdigit() else len(states),
                    name=s.labels.get("modelName", "unknown GPU"),
                    uuid=s.labels.get("UUID", ""),
                    memory_total_bytes=int(total_mib * MIB),
                    memory_used_bytes=int(used_mib * MIB),
                    memory_free_bytes=int(free_mib * MIB),
                    utilization_gpu_pct=None,
                    utilization_memory_pct=None,
                )
            )
        return states
