"""A torch worker for the warm-start tests: OUT_DIR/<restart>-<rank>.json says whether torch and
torch._dynamo were imported before its first line, whether CUDA is initialized, and its seed;
the first attempt exits 1 so that the restart is the one forked for sure."""

import sys

PRELOADED = "torch" in sys.modules and "torch._dynamo" in sys.modules

import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402

record = {
    "preloaded": PRELOADED,
    "cuda_initialized": torch.cuda.is_initialized(),
    "seed": torch.initial_seed(),
    "rand": torch.rand(1).item(),
}
name = f"{os.environ['TORCHELASTIC_RESTART_COUNT']}-{os.environ['RANK']}"
with open(os.path.join(sys.argv[1], name + ".json"), "w") as handle:
    json.dump(record, handle)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(1)
