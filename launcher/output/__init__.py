"""Worker output, as torchrun's: the output plan of each attempt (``streams``), the built-in layout
(``default``) and a torch ``LogsSpecs`` one (``torch_specs``) -- the CLI picks the strategy -- the
pump that copies worker pipes (``pump``), and what the agent itself says (``console``: its lines,
the rendezvous progress line, the JSON log format)."""

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
