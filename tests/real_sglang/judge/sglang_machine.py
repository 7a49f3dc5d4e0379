"""The simulated machine under SGLang: one mutable record of what the current case's hardware
reports, and the patches that make SGLang's device and host probes read it.

Imported only by ``sglang_side.py`` in the SGLang virtual environment, after the shim stubs
(``sgl_kernel``, ``torchvision``) are installed and before any other SGLang module, so that
``from sglang.srt.utils.common import get_device_memory_capacity`` copies taken at import
time already point at the simulated GPU.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

import sglang.srt.utils.common as common  # type: ignore[import-not-found]

GIB = 1 << 30


@dataclass
class Machine:
    """What one case's hardware reports; ``sglang_side`` sets it before each case."""

    gpu_mib: float = 143771.0  # nvidia-smi memory.total of an H200
    free_gib: float = 140.0  # torch.cuda.mem_get_info free, in GiB, at the moment of the query
    host_available_bytes: int = 2048 * GIB  # psutil.virtual_memory().available
    cgroup_headroom_bytes: int | None = None  # host_memory._cgroup_memory_headroom()
    ranks_per_host: int = 1


MACHINE = Machine()


def device_memory_capacity(device: str | None = None) -> float:
    """utils/common.py::get_device_memory_capacity: the per-GPU total in MiB."""
    return MACHINE.gpu_mib


def available_gpu_memory(*args: Any, **kwargs: Any) -> float:
    """utils/common.py::get_available_gpu_memory: free GiB (already the minimum over ranks)."""
    return MACHINE.free_gib


common.get_device_memory_capacity = device_memory_capacity


def treat_device_as_cuda() -> None:
    """Make run-time ``is_cuda()`` calls answer True, as on an NVIDIA GPU.

    Module-level ``_is_cuda = is_cuda()`` constants were taken at import and stay False, so
    no CUDA kernel path is imported; the defaults that SGLang picks at resolution time by
    calling ``is_cuda()`` (model_executor/cuda_graph_config.py: the breakable prefill graph)
    and those read through ``get_platform()`` (overridden by ``sglang_side``) are CUDA's.
    """
    # Imported here, not at the top: common.get_device_memory_capacity must be replaced first.
    import sglang.srt.utils as utils  # noqa: PLC0415

    common.is_cuda = lambda: True
    utils.is_cuda = common.is_cuda


def replace_copies() -> None:
    """Point every imported copy of the two GPU probes at the simulated machine."""
    originals = {"get_device_memory_capacity": device_memory_capacity}
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang") or not isinstance(module, types.ModuleType):
            continue
        for attr, replacement in originals.items():
            if getattr(module, attr, None) is not None:
                setattr(module, attr, replacement)
    import sglang.srt.mem_cache.kv_cache_configurator as configurator  # type: ignore[import-not-found]  # noqa: PLC0415

    configurator.get_available_gpu_memory = available_gpu_memory


def patch_host_probes() -> None:
    """Host RAM, cgroup headroom and ranks per host, as HiCache's budget reads them
    (mem_cache/host_memory.py::available_host_memory_bytes, pool_host/base.py::ranks_per_host)."""
    import sglang.srt.mem_cache.host_memory as host_memory  # type: ignore[import-not-found]  # noqa: PLC0415
    import sglang.srt.mem_cache.pool_host.base as host_base  # type: ignore[import-not-found]  # noqa: PLC0415

    host_memory.psutil = types.SimpleNamespace(
        virtual_memory=lambda: types.SimpleNamespace(available=MACHINE.host_available_bytes)
    )
    host_memory._cgroup_memory_headroom = lambda proc_root=None: MACHINE.cgroup_headroom_bytes
    host_base.ranks_per_host = lambda: MACHINE.ranks_per_host
