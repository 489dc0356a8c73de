"""Where a run's records go besides metrics.jsonl: the logger protocol and the built-in ones.

A logger is told the config once, then gets every metrics record (a flat dict keyed like
metrics.jsonl's lines, at most about 200 a run by default) and finally the run's summary
(summary.json's dict). The config key `loggers` names them:

    loggers: [tensorboard, wandb, console, my_pkg.logs:MyLogger]

- tensorboard: event files under RUN_DIR/tb (tianjax/metrics/tensorboard.py; evaluations
  under eval/, their videos as animated images), and the
  config as hyperparameters with the summary's figures as their metrics (the HPARAMS tab);
- wandb: a Weights & Biases run (the `wandb` section: project, entity, tags, mode, name,
  group; mode offline writes it under RUN_DIR/wandb for `wandb sync`), evaluation videos
  as W&B videos;
- console: one line per record on stderr (env steps, return, throughput);
- "module:Class": your own class, called with no arguments, following `Logger`.

Loggers start on their first call (a run that fails before its first record leaves no
empty TensorBoard file or W&B run). A logger that fails is reported on stderr once and
then left out: an outside service cannot stop a run.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Protocol, runtime_checkable

from tianjax.config import Config, ConfigError


@runtime_checkable
class Logger(Protocol):
    def start(self, config: Config, run_dir: str) -> None:
        """Called once, before the first record: the run's config and its directory."""

    def record(self, record: dict) -> None:
        """One metrics record (JSON-safe values: numbers, None, lists, dicts)."""

    def summary(self, summary: dict) -> None:
        """The finished run's summary (summary.json)."""

    def close(self) -> None:
        """Flush and release; called once at the end, also after a failure."""


def flat_config(config: Config) -> dict:
    """The sections the run reads, flattened to dotted keys with scalar values."""
    out = {}
    for key, value in config.to_dict(read_only=True).items():
        if isinstance(value, dict):
            for sub, v in value.items():
                out[f"{key}.{sub}"] = v
        else:
            out[key] = value
    return {
        k: (v if isinstance(v, (bool, int, float, str)) or v is None else str(v))
        for k, v in out.items()
    }


class TensorBoardLogger:
    def start(self, config: Config, run_dir: str) -> None:
        from tianjax.metrics.tensorboard import TensorBoardWriter

        self._config = config
        self._tb = TensorBoardWriter(run_dir)

    def record(self, record: dict) -> None:
        self._tb.write(record)

    def summary(self, summary: dict) -> None:
        self._tb.write_hparams(flat_config(self._config), summary)

    def close(self) -> None:
        self._tb.close()


class WandbLogger:
    """A W&B run: the records as its history (step: env steps), the summary as its summary,
    the config (the sections the run reads) as its config."""

    def start(self, config: Config, run_dir: str) -> None:
        import wandb

        self._run_dir = run_dir
        w = config.wandb
        mode = w.mode or os.environ.get("WANDB_MODE") or "online"
        self._run = wandb.init(
            project=w.project,
            entity=w.entity,
            tags=list(w.tags) or None,
            mode=mode,
            name=w.name or os.path.basename(run_dir),
            group=w.group,
            dir=run_dir,
            config=config.to_dict(read_only=True),
            reinit="create_new",
        )

    def record(self, record: dict) -> None:
        data = {
            k: v
            for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        video = record.get("eval_video")
        if isinstance(video, str):  # an evaluation's episode (an mp4 in the run directory)
            import wandb

            data["eval_video"] = wandb.Video(os.path.join(self._run_dir, video), format="mp4")
        self._run.log(data)

    def summary(self, summary: dict) -> None:
        for k, v in summary.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                self._run.summary[k] = v

    def close(self) -> None:
        self._run.finish()


class ConsoleLogger:
    """A line per record on stderr: for runs without a terminal progress bar (batch jobs)."""

    def start(self, config: Config, run_dir: str) -> None:
        self._total = config.total_env_steps * config.num_seeds

    def record(self, record: dict) -> None:
        def f(key, spec):
            v = record.get(key)
            return "-" if not isinstance(v, (int, float)) else format(v, spec)

        if "eval_return" in record:
            print(
                f"tianjax: eval of version {f('updates', 'd')} ({f('env_steps', ',.0f')} env steps): "
                f"return {f('eval_return', '.4g')} over {f('eval_episodes', 'd')} episodes",
                file=sys.stderr,
                flush=True,
            )
            return
        print(
            f"tianjax: {f('env_steps', ',.0f')}/{self._total:,} env steps  return {f('return_mean_100', '.4g')}"
            f"  {f('env_steps_per_s', ',.0f')} steps/s  {f('wall_time_s', '.1f')} s",
            file=sys.stderr,
            flush=True,
        )

    def summary(self, summary: dict) -> None:
        pass

    def close(self) -> None:
        pass


BUILTIN = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger, "console": ConsoleLogger}


def resolve(name: str):
    """The logger class a `loggers` entry names; ConfigError naming the key."""
    if name in BUILTIN:
        return BUILTIN[name]
    from tianjax.config.references import resolve_reference

    cls = resolve_reference(name, "loggers")
    missing = [
        m for m in ("start", "record", "summary", "close") if not callable(getattr(cls, m, None))
    ]
    if missing:
        raise ConfigError(
            f"config key 'loggers': {name!r} lacks {', '.join(missing)} (a logger has start, "
            "record, summary and close; see tianjax.metrics.loggers.Logger)"
        )
    return cls


def check_loggers(config: Config) -> None:
    """Every `loggers` entry resolves (the extras they need are checked by preflight)."""
    for name in config.loggers:
        if name not in BUILTIN:
            resolve(name)


class Loggers:
    """The run's loggers, started on first use; a failing one is dropped with one line."""

    def __init__(self, config: Config, run_dir: str, names):
        self._config, self._run_dir = config, run_dir
        self._pending = [(n, resolve(n)) for n in names]
        self._live: list = []
        self._started = False

    def _start(self) -> None:
        self._started = True
        for name, cls in self._pending:
            try:
                logger = cls()
                logger.start(self._config, self._run_dir)
            except Exception as e:  # noqa: BLE001 (a user's or a service's code)
                self._warn(name, "start", e)
            else:
                self._live.append((name, logger))

    def _each(self, method: str, *args) -> None:
        if not self._started:
            self._start()
        for item in list(self._live):
            name, logger = item
            try:
                getattr(logger, method)(*args)
            except Exception as e:  # noqa: BLE001
                self._warn(name, method, e)
                self._live.remove(item)

    @staticmethod
    def _warn(name: str, method: str, e: Exception) -> None:
        line = (str(e).strip().splitlines() or [""])[0]
        print(
            f"tianjax: warning: logger {name!r} failed in {method} ({type(e).__name__}: {line}); "
            "left out for the rest of the run (metrics.jsonl has every record)",
            file=sys.stderr,
            flush=True,
        )

    def record(self, record: dict) -> None:
        self._each("record", record)

    def summary(self, summary: dict) -> None:
        self._each("summary", summary)

    def close(self, failing: BaseException | None = None) -> None:
        """Closes each logger. `failing`: the error the run ends with; a logger that fails
        to close for the same resource (a full disk: its last events could not be written
        either) is not reported, the run's own error line says it."""
        from tianjax.checkpoint.failures import resource_errno

        cause = None if failing is None else resource_errno(failing)
        if self._started:
            for name, logger in self._live:
                try:
                    logger.close()
                except Exception as e:  # noqa: BLE001
                    if cause is None or resource_errno(e) != cause:
                        self._warn(name, "close", e)
        self._live = []


__all__ = [
    "BUILTIN",
    "ConsoleLogger",
    "Logger",
    "Loggers",
    "TensorBoardLogger",
    "WandbLogger",
    "check_loggers",
    "flat_config",
    "resolve",
]
