"""A module that opens a file when it is imported (as a library's log might), for the warm-start
tests: preloaded, the file is opened in the warm interpreter, before any worker is forked.
``PREOPENED`` names the file; it is opened to append, buffered, and its first line says whether
the cyclic collector was on while the module was imported."""

import gc
import os

LOG = open(os.environ["PREOPENED"], "a")  # noqa: SIM115 -- held open for the life of the process
LOG.write(f"collector-{'on' if gc.isenabled() else 'off'}\n")
LOG.flush()
