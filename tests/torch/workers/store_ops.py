"""Every TCPStore client call against the store at PORT, with two clients; prints one JSON list
of what each call returned (or the type of error it raised), in order."""

import datetime
import json
import sys
import threading
import time

import torch.distributed as dist

port = int(sys.argv[1])
seconds = datetime.timedelta(seconds=10)
a = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=seconds, world_size=2)
b = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=seconds, world_size=2)
results = []


def note(call):
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 -- the error's type is the result compared
        value = f"raised {type(exc).__name__}"
    results.append(value.decode("latin-1") if isinstance(value, bytes) else value)


note(lambda: a.set("k", b"v") or "set")
note(lambda: b.get("k"))
note(lambda: a.add("n", 5))
note(lambda: b.add("n", -2))
note(lambda: a.get("n"))
note(lambda: a.check(["k", "n"]))
note(lambda: a.check(["k", "absent"]))
note(lambda: a.compare_set("k", b"v", b"w"))
note(lambda: a.compare_set("k", b"v", b"x"))
note(lambda: a.compare_set("fresh", b"", b"f"))
note(lambda: a.compare_set("absent", b"e", b"z"))
note(lambda: a.append("k", b"+") or "appended")
a.check(["k"])  # a's calls without an answer are done once one with an answer returns: then b asks
note(lambda: b.get("k"))
note(lambda: a.num_keys())
note(lambda: a.delete_key("fresh"))
note(lambda: a.delete_key("fresh"))
note(lambda: a.multi_set(["m1", "m2"], [b"1", b"2"]) or "multi_set")
a.check(["k"])
note(lambda: [v.decode() for v in b.multi_get(["m1", "m2"])])
note(lambda: a.queue_push("q", b"first") or "pushed")
note(lambda: a.queue_push("q", b"second") or "pushed")
a.check(["k"])
note(lambda: b.queue_len("q"))
note(lambda: b.queue_pop("q"))
note(lambda: b.queue_pop("q", block=False))
note(lambda: b.queue_pop("q", block=False))
note(lambda: a.wait(["never"], datetime.timedelta(milliseconds=200)))
note(lambda: a.get("k"))  # the connection works after a cancelled wait
note(lambda: a.wait(["k", "absent"], datetime.timedelta(milliseconds=200)))  # one of two keys: it times out
threading.Timer(0.3, lambda: b.set("second", b"S")).start()
started = time.monotonic()
note(lambda: a.wait(["k", "second"]) or "waited")  # one there, the other set later: it waits for both
note(lambda: time.monotonic() - started > 0.2)
threading.Timer(0.3, lambda: b.set("later", b"L")).start()
started = time.monotonic()
note(lambda: a.get("later"))  # waits for b's set
note(lambda: time.monotonic() - started > 0.2)
note(lambda: len(a.get("big") if a.set("big", b"x" * (4 << 20)) is None else b""))
print(json.dumps(results))
