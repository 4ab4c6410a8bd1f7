"""What this node's GPUs look like to the sidecar, and how its codec work yields to the model.

NVML answers without a CUDA context (so without costing the model any GPU memory) and
names devices by UUID, the one identifier both processes agree on. Every query degrades:
without NVML or a GPU the answers are None and the defaults, and the log says so once per
process, not once per request.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

import torch

from sidecar.log import get_logger

log = get_logger(__name__)

BUSY_UTILIZATION_PERCENT = 50
"""Above this GPU utilization the model is busy: codec work takes one stream, not several."""

CODEC_STREAMS_IDLE = 2
CODEC_STREAMS_BUSY = 1
LOWEST_STREAM_PRIORITY = 0
"""CUDA orders stream priorities by lower number first and 0, the default, is the least:
codec streams never outrank the model's, but run level with a model that keeps the default
(the scheduler then shares the GPU between them); a model server that wants precedence
runs its own streams at a negative priority."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as NVML reports it at the time of the query."""

    uuid: str
    name: str
    memory_free: int
    memory_total: int
    pcie_link_width: int
    pcie_link_generation: int
    utilization_percent: int


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """Where codec work runs: the device, how many CUDA streams and at which priority."""

    device: torch.device
    streams: int
    priority: int


def normal_uuid(uuid: str) -> str:
    """A GPU UUID without the `GPU-` prefix, lower case: nvidia-smi and torch spell it apart."""
    return uuid.strip().lower().removeprefix("gpu-")


@functools.cache
def _nvml() -> ModuleType | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses or OSError per platform.
        log.info("nvml unavailable: GPU queries answer with defaults", reason=str(exc))
        return None
    return pynvml


def gpu_info(uuid: str) -> GpuInfo | None:
    """The GPU with this UUID, or None without NVML or when no such GPU is on this node."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        device = nvml.nvmlDeviceGetHandleByUUID(f"GPU-{normal_uuid(uuid)}")
        memory = nvml.nvmlDeviceGetMemoryInfo(device)
        return GpuInfo(
            uuid=nvml.nvmlDeviceGetUUID(device),
            name=nvml.nvmlDeviceGetName(device),
            memory_free=memory.free,
            memory_total=memory.total,
            pcie_link_width=nvml.nvmlDeviceGetCurrPcieLinkWidth(device),
            pcie_link_generation=nvml.nvmlDeviceGetCurrPcieLinkGeneration(device),
            utilization_percent=nvml.nvmlDeviceGetUtilizationRates(device).gpu,
        )
    except nvml.NVMLError as exc:
        log.warning("nvml query failed", uuid=uuid, reason=str(exc))
        return None


@functools.cache
def cuda_available() -> bool:
    """Whether CUDA handles can be opened here; the CPU fallback is logged once."""
    available = torch.cuda.is_available()
    if not available:
        log.info("no CUDA GPU: only shared-memory handles open, codecs run on the CPU")
    return available


def cuda_index(uuid: str) -> int | None:
    """The torch device index of the GPU with this UUID in this process, if it sees it."""
    wanted = normal_uuid(uuid)
    for index in range(torch.cuda.device_count()):
        if normal_uuid(str(torch.cuda.get_device_properties(index).uuid)) == wanted:
            return index
    return None


def device_uuid(device: torch.device) -> str:
    """The UUID of one of this process's CUDA devices: what NVML and a plan name it by."""
    return str(torch.cuda.get_device_properties(device).uuid)


def codec_stream_plan(uuid: str | None) -> StreamPlan:
    """Where to run codec work for buffers on the GPU `uuid` (None: CPU buffers).

    Fewer streams while the model keeps the GPU busy, always at the lowest priority, so
    compression fills the gaps between the model's kernels rather than competing for SMs.
    """
    if uuid is None or not cuda_available():
        return StreamPlan(torch.device("cpu"), streams=0, priority=LOWEST_STREAM_PRIORITY)
    index = cuda_index(uuid)
    if index is None:
        return StreamPlan(torch.device("cpu"), streams=0, priority=LOWEST_STREAM_PRIORITY)
    info = gpu_info(uuid)
    busy = info is not None and info.utilization_percent >= BUSY_UTILIZATION_PERCENT
    return StreamPlan(
        torch.device("cuda", index),
        streams=CODEC_STREAMS_BUSY if busy else CODEC_STREAMS_IDLE,
        priority=LOWEST_STREAM_PRIORITY,
    )


def codec_streams(plan: StreamPlan) -> list[torch.cuda.Stream]:
    """The CUDA streams a plan asks for; none on the CPU."""
    return [
        torch.cuda.Stream(device=plan.device, priority=plan.priority) for _ in range(plan.streams)
    ]
