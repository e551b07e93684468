"""``@record``: write a worker's uncaught exception to its TORCHELASTIC_ERROR_FILE (torch's layout).

The one implementation is the launcher's (``launcher.workers.errorfile``), which reads the file back for the
failure summary; this is where user code finds it.
"""

from launcher.workers.errorfile import record

__all__ = ["record"]
