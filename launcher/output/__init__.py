"""Worker output, as torchrun's: the plan of each attempt (``plan``), the built-in layout
(``default``) and a torch ``LogsSpecs`` one (``torch_specs``) -- the CLI picks the strategy -- and
the pump that copies worker pipes (``pump``)."""

from .default import DefaultLayout
from .pump import LogPump
from .streams import Layout, LayoutStrategy, RankLogs, Std, StreamPlan
from .torch_specs import TorchLogsSpecsLayout, load_logs_specs

__all__ = [
    "DefaultLayout",
    "Layout",
    "LayoutStrategy",
    "LogPump",
    "RankLogs",
    "Std",
    "StreamPlan",
    "TorchLogsSpecsLayout",
    "load_logs_specs",
]
