"""Launching workers from Python, with torch's shape (``torch.distributed.launcher.api``): see
``launcher.api``."""

from launcher.api import LaunchConfig, elastic_launch

__all__ = ["LaunchConfig", "elastic_launch"]
