"""The holder of the chaos fault `gpu_memory` (controlplane.agent.resource_faults): it allocates `--mib` MiB on one
GPU with torch and holds them until `--until` (Unix seconds), or until it is killed:

    CUDA_VISIBLE_DEVICES=1 python controlplane/agent/gpu_hold.py --until 1767225600 --mib 4096 --gpu 1

The agent sets CUDA_VISIBLE_DEVICES to the node's GPU index (and CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML's order, which
Node.gpus lists), so the GPU is `cuda:0` here; `--gpu` is the physical index, for the lines it prints. It prints
one line `holding ...` once the memory is allocated and written, which the agent waits for; any failure (no CUDA,
less free memory than asked, an allocation that fails) is one line `gpu_memory: ...` and exit status 2, which the
agent reports as the fault's error. Run as a file, like hog.py: the `controlplane` package would import Django.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

MIB = 1024 * 1024
EXIT_FAILED = 2


class HoldFailed(Exception):
    pass


def allocate(mib: int, gpu: int):
    """`mib` MiB on cuda:0 (the one GPU visible), written (so that it is backed, not only reserved): the tensor."""
    import torch  # here, not at the top: --help and a bad flag answer without the seconds torch takes to import

    if not torch.cuda.is_available():
        raise HoldFailed(f"CUDA is not available on this host (torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): no GPU {gpu} to hold memory on")
    device = torch.device("cuda", 0)
    free, total = torch.cuda.mem_get_info(device)
    if mib * MIB > free:
        raise HoldFailed(f"GPU {gpu} has {free // MIB} MiB free of {total // MIB} MiB; {mib} MiB asked")
    try:
        block = torch.empty(mib * MIB, dtype=torch.uint8, device=device)
        block.fill_(1)
        torch.cuda.synchronize(device)
    except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one: another process took the memory meanwhile
        raise HoldFailed(f"allocating {mib} MiB on GPU {gpu} failed: {str(exc).splitlines()[0]}") from None
    return block


def hold(mib: int, gpu: int, until: float) -> int:
    try:
        block = allocate(mib, gpu)
    except HoldFailed as exc:
        print(f"gpu_memory: {exc}", flush=True)
        return EXIT_FAILED
    import torch

    name = torch.cuda.get_device_name(0)
    print(f"holding {block.numel() // MIB} MiB on GPU {gpu} ({name}) until {until:.3f}", flush=True)
    while time.time() < until:
        time.sleep(min(0.5, max(0.0, until - time.time())))
    del block
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_hold.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--until", type=float, required=True, help="exit at this time (Unix seconds)")
    parser.add_argument("--mib", type=int, required=True, help="allocate and write this many MiB")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU's physical (NVML) index, for the lines printed")
    args = parser.parse_args(argv)
    if args.mib < 1:
        parser.error("--mib must be at least 1")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    return hold(args.mib, args.gpu, args.until)


if __name__ == "__main__":
    sys.exit(main())
