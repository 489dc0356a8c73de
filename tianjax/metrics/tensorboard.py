"""TensorBoard event files under `<run_dir>/tb/`: the run's metrics records as scalars.

Every finite numeric scalar of a record becomes a TB scalar at global step
`record["env_steps"]`, under a tag grouped by what it measures (`return/`, `throughput/`,
`progress/`, `staleness/`, `balance/`, `loss/`, `counts/`; unknown keys go to
`misc/<key>`). Lists and dicts are skipped, except the interval staleness histogram
(`staleness_hist`: samples consumed since the previous record, indexed by tau), written as
a TB histogram.

An evaluation's record (tianjax.runtime.record.evaluations: its keys start with `eval_`)
is written under `eval/` only (eval/return beside return/mean_100, the training curve), at
the env steps of the version it evaluated; its video (`eval_video`, an mp4 in the run
directory) as the animated GIF preview written beside it, under eval/video in the Images
tab.

A resumed run appends a new event file to the same tb/ directory; TensorBoard reads them
all. tensorboardX writes from a background thread and flushes every `flush_secs` and on
close, so a record costs no disk sync.
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

HIST_KEY = "staleness_hist"
EVAL_PREFIX = "eval_"
VIDEO_KEY = "eval_video"

# record key -> tag; what is not here is under misc/<key> (algorithm metrics under loss/)
TAGS = {
    "return_mean_100": "return/mean_100",
    "win_rate_100": "return/win_rate_100",
    "episodes": "progress/episodes",
    "env_steps_per_s": "throughput/env_steps_per_s",
    "samples_consumed_per_s": "throughput/samples_consumed_per_s",
    "samples_fresh_per_s": "throughput/samples_fresh_per_s",
    "reuse_fraction": "throughput/reuse_fraction",
    "learner_busy_fraction": "throughput/learner_busy_fraction",
    "balance_target_staleness": "balance/target_staleness",
    "balance_staleness_measured": "balance/staleness_measured",
    "balance_window": "balance/credit_window",
    "balance_publish_every": "balance/publish_every",
    "balance_max_reuse": "balance/max_reuse",
    "balance_learner_bound": "balance/learner_bound",
    "balance_reserve": "balance/reserve",
    "balance_target_replay_ratio": "balance/target_replay_ratio",
    "balance_replay_ratio_measured": "balance/replay_ratio_measured",
    "lr": "schedules/lr",
    "epsilon": "schedules/epsilon",
    "actor_env_steps": "schedules/actor_env_steps",
    "actor_steps_lag_max": "schedules/actor_steps_lag_max",
    "replay_ratio": "balance/replay_ratio",
    "replay_ratio_target": "balance/replay_ratio_target",
    "samples_fresh": "balance/samples_fresh",
    "updates": "progress/updates",
    "wall_time_s": "progress/wall_time_s",
    "staleness_mean": "staleness/mean",
    "staleness_max": "staleness/max",
    "weight_min": "staleness/weight_min",
    "weight_max": "staleness/weight_max",
    "production_rate": "balance/p",
    "consumption_rate": "balance/c",
    "samples_produced": "balance/samples_produced",
    "samples_consumed": "balance/samples_consumed",
    "reused_batches": "balance/reused_batches",
    "throttled": "balance/throttled",
    "pool": "balance/pool",
    "actors_seen": "balance/actors_seen",
    "dropped_samples": "counts/dropped",
    "dropped_nonfinite": "counts/dropped_nonfinite",
    "dropped_bad_versions": "counts/dropped_bad_versions",
    "rejected_messages": "counts/rejected",
    "update_skipped": "counts/update_skipped",
}
LOSS_KEYS = frozenset(
    {
        "loss",
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_frac",  # PPO
        "rho_mean",
        "rho_max",
        "rho_clip_frac",
        "pg_advantage_mean",
        "vs_mean",
        "value_mean",  # IMPALA
        "q_mean",
        "q_max",
        "target_mean",
        "td_abs",
        "target_synced",  # DQN
    }
)


def tag_for(key: str) -> str:
    if key in TAGS:
        return TAGS[key]
    return f"loss/{key}" if key in LOSS_KEYS else f"misc/{key}"


def _scalar(v) -> float | None:
    """A finite real number as float; None for anything else (bools, text, NaN, arrays)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class TensorBoardWriter:
    """Writes metrics records as TensorBoard events in `<run_dir>/tb/`."""

    def __init__(self, run_dir: str, flush_secs: int = 30):
        self.log_dir = os.path.join(run_dir, "tb")
        os.makedirs(self.log_dir, exist_ok=True)
        # NOTE: event files are named by the second they were opened and the host; a run
        # resumed within the same second would overwrite the last file, so number them.
        n = sum(1 for f in os.listdir(self.log_dir) if ".tfevents." in f)
        # NOTE: imported here, not at the top: every process that imports tianjax (each actor
        # too) would otherwise load tensorboardX and protobuf, and only the learner writes
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(self.log_dir, flush_secs=flush_secs, filename_suffix=f".{n}")

    def write(self, record: dict) -> None:
        if _scalar(record.get("env_steps")) is None:
            return  # no x axis, nothing to place
        from tensorboardX.proto.summary_pb2 import Summary

        step = int(record["env_steps"])
        values = []
        evaluation = "eval_return" in record
        for key, value in record.items():
            if key == "env_steps":
                continue
            if evaluation:
                if key == VIDEO_KEY:
                    self._video(value, step)
                elif key.startswith(EVAL_PREFIX) and (v := _scalar(value)) is not None:
                    values.append(
                        Summary.Value(tag=f"eval/{key[len(EVAL_PREFIX) :]}", simple_value=v)
                    )
                continue
            if key == HIST_KEY:
                self._histogram(value, step)
                continue
            v = _scalar(value)
            if v is not None:
                values.append(Summary.Value(tag=tag_for(key), simple_value=v))
        # NOTE: one event for the whole record, not one per scalar (add_scalar's way):
        # tensorboardX passes every event through a multiprocessing queue, and a record's
        # ~20 puts were most of the host time a fused run spends between its chunks.
        # TensorBoard reads the values of one event as if each had come alone.
        if values:
            self._writer._get_file_writer().add_summary(Summary(value=values), step)

    def _video(self, name, step: int) -> None:
        """The GIF preview of an evaluation's video (an mp4 path relative to the run
        directory), as an image TensorBoard animates; nothing where there is none."""
        from tensorboardX.proto.summary_pb2 import Summary

        from tianjax.metrics.video import gif_of

        if not isinstance(name, str):
            return
        path = gif_of(os.path.join(os.path.dirname(self.log_dir), name))
        try:
            with open(path, "rb") as f:
                data = f.read()
            from PIL import Image

            with Image.open(path) as im:
                width, height = im.size
        except (OSError, ImportError):
            return
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=data)
        self._writer._get_file_writer().add_summary(
            Summary(value=[Summary.Value(tag="eval/video", image=image)]), step
        )

    def _histogram(self, counts, step: int) -> None:
        """Counts indexed by tau; bucket tau spans (tau - 0.5, tau + 0.5]."""
        if not isinstance(counts, (list, tuple, np.ndarray)):
            return
        counts = np.asarray(counts, np.float64)
        if (
            counts.ndim != 1
            or counts.size == 0
            or not np.all(np.isfinite(counts))
            or counts.sum() <= 0
        ):
            return
        taus = np.arange(counts.size, dtype=np.float64)
        seen = taus[counts > 0]
        self._writer.add_histogram_raw(
            "staleness/tau",
            min=float(seen.min()),
            max=float(seen.max()),
            num=float(counts.sum()),
            sum=float(counts @ taus),
            sum_squares=float(counts @ taus**2),
            bucket_limits=(taus + 0.5).tolist(),
            bucket_counts=counts.tolist(),
            global_step=step,
        )

    def write_hparams(self, hparams: dict, summary: dict) -> None:
        """The config as hyperparameters (TensorBoard's HPARAMS tab), with the summary's
        finite numbers as their metrics, in this run's own event file."""
        from tensorboardX.summary import hparams as hparams_summary

        metrics = {
            f"summary/{k}": float(v)
            for k, v in summary.items()
            if _scalar(v) is not None and not isinstance(v, bool)
        }
        values = {k: ("null" if v is None else v) for k, v in hparams.items()}
        exp, ssi, sei = hparams_summary(values, metrics)
        fw = self._writer._get_file_writer()
        for s in (exp, ssi, sei):
            fw.add_summary(s)
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, int(summary.get("env_steps") or 0))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


__all__ = [
    "EVAL_PREFIX",
    "HIST_KEY",
    "VIDEO_KEY",
    "LOSS_KEYS",
    "TAGS",
    "TensorBoardWriter",
    "tag_for",
]
