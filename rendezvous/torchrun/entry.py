"""The ``etcd-v3`` entry point in torchrun's ``torchrun.handlers`` group (see pyproject.toml).

torch loads every handler entry point when torch.distributed's rendezvous registry is imported --
by each torchrun, whatever ``--rdzv-backend`` it is given. This module is all that costs: the
handler (``plugin``: gRPC, the etcd client, the rounds) is imported the first time torchrun asks
for an ``etcd-v3`` handler, so installing the package leaves a ``c10d`` or ``static`` torchrun
as fast as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["handler_creator"]


def handler_creator() -> Callable[[Any], Any]:
    """What torchrun registers under ``etcd-v3``: a creator that imports the handler when called."""
    return _create_handler


def _create_handler(params: Any) -> Any:
    from .plugin import create_handler

    return create_handler(params)
