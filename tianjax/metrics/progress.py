"""Console progress: a live bar on a terminal, periodic plain lines elsewhere, silent in CI."""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm


def _interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


class Progress:
    """Env steps of total, steps/s, recent return (and whatever else is posted)."""

    def __init__(
        self,
        total_env_steps: int,
        enabled: bool | None = None,
        desc: str = "train",
        line_every_s: float = 5.0,
        name: str | None = None,
    ):
        """`name`: one of several processes that share a console (a learner group): no
        bar, plain lines that open with the name (silent in CI)."""
        self.total = int(total_env_steps)
        self.name = name
        if name is not None:
            enabled = False
        self.enabled = _interactive() if enabled is None else enabled
        self.quiet_lines = (
            not self.enabled and not os.environ.get("CI") and (enabled is None or name is not None)
        )
        self._bar = (
            tqdm(
                total=self.total,
                desc=desc,
                unit="step",
                unit_scale=True,
                dynamic_ncols=True,
                leave=True,
            )
            if self.enabled
            else None
        )
        self._last = 0
        self._last_line = 0.0
        self._every = line_every_s

    def update(self, env_steps: int, **postfix) -> None:
        env_steps = min(int(env_steps), self.total)
        fields = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()}
        if self._bar is not None:
            self._bar.update(env_steps - self._last)
            self._bar.set_postfix(fields, refresh=False)
        elif self.quiet_lines and time.monotonic() - self._last_line >= self._every:
            # Not a terminal (a log file, a notebook pipe): a plain line now and then.
            self._last_line = time.monotonic()
            extra = " ".join(f"{k}={v}" for k, v in fields.items())
            who = f"{self.name} " if self.name else ""
            print(
                f"{who}[{100 * env_steps / self.total:5.1f}%] {env_steps}/{self.total} steps {extra}",
                file=sys.stderr,
                flush=True,
            )
        self._last = env_steps

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


__all__ = ["Progress"]
