"""Hosts a c10d store until stdin closes, printing its port: torch's own TCPStore server
(``torch``) or the agent's (``agent``; ``agent-late``: its socket listens at once but is served
only after 1 s, as a round's store is when clients come before the round's host serves it)."""

import datetime
import sys
import time

kind = sys.argv[1]
if kind == "torch":
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30)
    )
    print(store.port, flush=True)
else:
    from launcher.c10dstore import StoreHost

    host = StoreHost()
    port = host.port()
    print(port, flush=True)
    if kind == "agent-late":
        time.sleep(1.0)
    host.serve(port)
sys.stdin.read()
