"""A DDP worker on the GPU for tests/gpu: gloo (the ranks of one node share its one GPU; NCCL takes
a GPU a rank), the model and optimizer on ``cuda``, their state kept with ``elastic.checkpoint``.

argv: OUT STEPS DIE_RANK DIE_AT. OUT/<attempt>-<rank>.json records what the process found at its
first line (torch preloaded? CUDA initialized?), what it loaded (step, the devices of the loaded
tensors, a checksum) and when it started; OUT/steps-<attempt>-<rank>.txt one line a step: the step,
its wall-clock end, the checksum of the state it saved. DIE_RANK SIGKILLs itself in attempt 0
right after its save of step DIE_AT, writing OUT/killed first (its wall clock)."""

import sys

PRELOADED = "torch" in sys.modules

import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import elastic.checkpoint as ckpt  # noqa: E402


def checksum(state: dict) -> float:
    return float(sum(t.double().sum().item() for t in state["model"].values()))


def devices(state: dict) -> list[str]:
    return sorted({str(t.device) for t in state["model"].values()})


def main() -> None:
    out, steps, die_rank, die_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    record = {"rank": rank, "attempt": attempt, "pid": os.getpid(), "started": time.time()}
    record.update(preloaded=PRELOADED, cuda_initialized=torch.cuda.is_initialized())
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(256, 256).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = ckpt.load()
    record["loaded"] = None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        record["loaded"] = {"step": state["step"], "devices": devices(state), "checksum": checksum(state)}
    with open(os.path.join(out, f"{attempt}-{rank}.json"), "w") as handle:
        json.dump(record, handle)
    log = open(os.path.join(out, f"steps-{attempt}-{rank}.txt"), "w", buffering=1)
    generator = torch.Generator(device=device)
    for step in range(0 if state is None else state["step"] + 1, steps):
        generator.manual_seed(step * 100 + rank)
        model(torch.randn(32, 256, device=device, generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        ckpt.save(saved, step=step)
        log.write(f"{step} {time.time():.4f} {checksum(saved)!r}\n")
        if attempt == 0 and rank == die_rank and step == die_at:
            with open(os.path.join(out, "killed"), "w") as handle:
                handle.write(f"{time.time():.4f}")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)
    dist.destroy_process_group()  # as the tutorials end: the DDP model lives until main() returns


if __name__ == "__main__":
    main()
