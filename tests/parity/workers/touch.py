"""A worker for the launcher cases run through torchrun and elastic-run alike.

Touches ``<dir>/<RANK>``; prints ``creating <RANK>`` on stdout and ``err <RANK>`` on stderr;
``--fail`` exits 1 after touching; ``--out-file`` writes torch.distributed.is_torchelastic_launched();
``--init-method`` joins a gloo group of WORLD_SIZE and all-reduces; ``--env-dir`` dumps the env.
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--touch-file-dir")
parser.add_argument("--fail", action="store_true")
parser.add_argument("--out-file")
parser.add_argument("--init-method")
parser.add_argument("--env-dir")
args = parser.parse_args()
rank = os.environ["RANK"]
# One write per line: print() writes the text and the newline separately, and two ranks sharing the
# console could interleave between them under either launcher.
for stream, text in ((sys.stdout, f"creating {rank}\n"), (sys.stderr, f"err {rank}\n")):
    stream.write(text)
    stream.flush()
if args.touch_file_dir:
    open(os.path.join(args.touch_file_dir, rank), "w").close()
if args.env_dir:
    with open(os.path.join(args.env_dir, rank + ".json"), "w") as handle:
        json.dump(dict(os.environ), handle)
if args.out_file:
    import torch.distributed as dist

    with open(args.out_file, "w") as handle:
        handle.write(str(dist.is_torchelastic_launched()))
if args.init_method:
    import torch
    import torch.distributed as dist

    kwargs = {"rank": int(rank), "world_size": int(os.environ["WORLD_SIZE"])}
    dist.init_process_group("gloo", init_method=args.init_method, **kwargs)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == int(os.environ["WORLD_SIZE"])
    dist.destroy_process_group()
if args.fail:
    sys.exit(1)
