"""A worker that says it runs (creates the file argv[1]) and then waits to be stopped (at most 120 s)."""

import sys
import time

open(sys.argv[1], "w").close()
time.sleep(120)
