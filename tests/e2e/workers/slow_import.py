"""A module whose import keeps a CPU busy until the file ``$SLOW_IMPORT_UNTIL`` exists (at most 60 s):
a warm interpreter's preload that is still running while a test looks at it."""

import os
import time

_until = os.environ.get("SLOW_IMPORT_UNTIL", "")
_deadline = time.monotonic() + 60.0
while _until and not os.path.exists(_until) and time.monotonic() < _deadline:
    sum(range(10000))  # busy: the import takes CPU, as torch's does
