"""A worker whose rank R keeps working (a CPU loop) for S seconds while the others exit 0 at once:
a node that never finishes within an exit barrier, and a rank never judged stuck (it works).

    lingering.py R S
"""

import os
import sys
import time

if int(os.environ["RANK"]) == int(sys.argv[1]):
    ends = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < ends:
        pass
