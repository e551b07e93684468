"""The worker process of a Python function entrypoint (``launcher.api.elastic_launch``).

    python -u -m launcher.workers.fn_worker PAYLOAD RESULTS_DIR

PAYLOAD is a file the launching process wrote (``payload.dump_payload``; never anything read from
etcd): multiprocessing's spawn preparation data (so a function defined in the caller's ``__main__``
resolves, as under torch's spawn), then the function and its arguments, pickled by reference or
by value. Loading them and the call both run under ``@record``: whatever fails, the worker's error
file says it. The return value is pickled to ``RESULTS_DIR/<RANK>.pkl`` for the launching process.
"""

from __future__ import annotations

import os
import pickle
import sys


def main(payload_path: str, results_dir: str) -> None:
    from .errorfile import record

    value = record(_call)(payload_path)
    rank = os.environ["RANK"]
    partial = os.path.join(results_dir, f"{rank}.pkl.{os.getpid()}")
    with open(partial, "wb") as handle:
        pickle.dump(value, handle)
    os.replace(partial, os.path.join(results_dir, f"{rank}.pkl"))


def _call(payload_path: str) -> object:
    from multiprocessing import spawn

    from .mainguard import PREPARING

    with open(payload_path, "rb") as handle:
        preparation = pickle.load(handle)
        os.environ[PREPARING] = "1"  # a launch while the script is imported refuses to run (mainguard)
        try:
            spawn.prepare(preparation)  # the caller's sys.path, cwd and __main__, as a spawned child gets them
        finally:
            del os.environ[PREPARING]
        fn, args = pickle.load(handle)
    return fn(*args)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
