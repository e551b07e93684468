"""The health gate's GPU check, run by path in a child interpreter with the workers' environment (the
agent itself never imports NVML or torch): ``python gpuprobe.py [--counters]``. It exits 0 on a
healthy node; otherwise the last line it prints says what failed. Standard library, ``pynvml`` and
torch only: nothing of this package is importable there for sure.

Two parts:

- NVML's view of every device, where ``pynvml`` (nvidia-ml-py) is installed and the driver's NVML
  answers: a device NVML cannot reach (fallen off the bus); the driver asking for a recovery
  action (a reset, a reboot, a drain: drivers r570 and later); uncorrected ECC errors since the
  driver loaded; rows remapped after an uncorrectable error and waiting for a reset, or a remapping
  that failed (Ampere and later); retired pages waiting for a reset (earlier GPUs). Each device
  query a GPU does not support is skipped. A few milliseconds, no CUDA context.
- a 1024x1024 matmul on every device CUDA shows, synchronized: the import of torch and a CUDA
  context, a second or more. With ``--counters`` (the check after this node's workers failed) it
  runs only where NVML could not answer: the counters see what breaks a GPU for good, and a
  restarted worker would find the rest within its first step.
"""

import sys

RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
RECOVERY_ACTIONS = {1: "a GPU reset", 2: "a node reboot", 3: "a drain of peer-to-peer traffic", 4: "a drain and reset"}


def _nvml():
    """The initialized pynvml module, or None when NVML cannot answer here."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 -- not installed, no libnvidia-ml, no driver: the matmul decides
        return None
    return pynvml


def _queried(nvml, call, *args):
    """``call(*args)``, or None when this GPU or driver does not support the query."""
    try:
        return call(*args)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15):
            raise
        return None


def _recovery_action(nvml, handle) -> int:
    field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD)
    values = _queried(nvml, nvml.nvmlDeviceGetFieldValues, handle, [field])
    if not values or values[0].nvmlReturn != 0:
        return 0  # a driver before r570: no such field
    return int(values[0].value.uiVal)


def device_fault(nvml, index: int) -> str | None:
    """What NVML says is wrong with device ``index`` (None: nothing)."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        action = _recovery_action(nvml, handle)
        kind, counter = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ecc = _queried(nvml, nvml.nvmlDeviceGetTotalEccErrors, handle, kind, counter) or 0
        remapped = _queried(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
        retired = _queried(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle) or 0
    except nvml.NVMLError as exc:
        return f"GPU {index}: NVML cannot reach it ({exc})"
    if action:
        return f"GPU {index}: the driver asks for {RECOVERY_ACTIONS.get(action, f'recovery action {action}')}"
    if ecc:
        return f"GPU {index}: {ecc} uncorrected ECC errors since the driver loaded"
    if remapped is not None and (remapped[2] or remapped[3]):
        return f"GPU {index}: " + ("a row remapping failed" if remapped[3] else "remapped rows wait for a GPU reset")
    if retired:
        return f"GPU {index}: retired pages wait for a GPU reset"
    return None


def matmul_on_each_device() -> int:
    import torch

    for index in range(torch.cuda.device_count()):
        with torch.cuda.device(index):
            a = torch.randn(1024, 1024, device="cuda")
            (a @ a).sum().item()
            torch.cuda.synchronize()
    return torch.cuda.device_count()


def main(argv: list[str]) -> None:
    nvml = _nvml()
    if nvml is not None:
        count = nvml.nvmlDeviceGetCount()
        for index in range(count):
            fault = device_fault(nvml, index)
            if fault is not None:
                sys.exit(fault)
        if "--counters" in argv:
            print(f"NVML: {count} devices clean")
            return
    print(f"NVML: {'not here' if nvml is None else 'clean'}; a matmul ran on {matmul_on_each_device()} devices")


if __name__ == "__main__":
    main(sys.argv[1:])
