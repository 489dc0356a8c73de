"""Run bookkeeping: run directory, metrics.jsonl, summary.json, episodes, console."""

from tianjax.metrics.logger import RunLogger, format_summary
from tianjax.metrics.progress import Progress
from tianjax.metrics.tracker import EpisodeTracker

__all__ = ["EpisodeTracker", "RunLogger", "Progress", "format_summary"]
