"""Run bookkeeping: run directory, metrics.jsonl, summary.json, episodes, console.

`Logger` is the protocol a logger of your own follows (`loggers: [my_module:MyLogger]`);
`read_metrics` reads a run's metrics.jsonl back.
"""

from tianjax.metrics.logger import RunLogger, format_summary, read_metrics
from tianjax.metrics.loggers import Logger
from tianjax.metrics.progress import Progress
from tianjax.metrics.tracker import EpisodeTracker

__all__ = ["EpisodeTracker", "Logger", "RunLogger", "Progress", "format_summary", "read_metrics"]
