"""The GPUs of this host, from NVML; [] where NVML does not initialise (no driver, a CPU host)."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def discover_gpus() -> list[dict]:
    """[{"index", "name", "memory_total_bytes"}] for every device NVML sees."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / _DriverNotLoaded: a CPU host
        log.info("NVML unavailable, registering a CPU node: %s", exc)
        return []
    gpus = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append({
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            })
    except Exception as exc:
        # A device that fails its query is left out rather than failing the agent's start.
        log.warning("NVML device query failed after %d GPUs: %s", len(gpus), exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus
