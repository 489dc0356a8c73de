"""Device lists in a config (`runtime.actor_devices`, `runtime.learner_devices`): a platform
alone ("cpu", "gpu", "cuda", "rocm", "tpu") or a platform and device ids, "gpu:0",
"gpu:0,1", "gpu:1-7" (ranges included, in the order written: actor processes are spread
over them in that order). Parsing only; where processes go and what each is told is
tianjax.launch.placement'."""

from __future__ import annotations

from typing import NamedTuple

from tianjax.config.checks import ConfigError

PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu")


class DeviceList(NamedTuple):
    platform: str  # as written: cpu, gpu, cuda, rocm or tpu
    ids: tuple[int, ...] | None  # None: the platform alone (its devices as JAX gives them)

    def __str__(self) -> str:
        return (
            self.platform
            if self.ids is None
            else f"{self.platform}:" + ",".join(map(str, self.ids))
        )


def parse_devices(text: str, key: str) -> DeviceList:
    """A DeviceList from "platform" or "platform:ids"; ConfigError naming `key`."""
    bad = (
        f"config key '{key}': expected a platform ({', '.join(PLATFORMS)}) or a platform "
        f"and device ids such as 'gpu:0' or 'gpu:0,1' or 'gpu:1-7', got {text!r}"
    )
    platform, sep, rest = str(text).strip().partition(":")
    platform = platform.strip().lower()
    if platform not in PLATFORMS:
        raise ConfigError(bad)
    if not sep:
        return DeviceList(platform, None)
    ids: list[int] = []
    for part in rest.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ConfigError(bad)
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo:
            raise ConfigError(bad)
        ids += range(lo, hi + 1)
    if len(set(ids)) != len(ids):
        raise ConfigError(f"config key '{key}': names a device twice, got {text!r}")
    return DeviceList(platform, tuple(ids))


__all__ = ["PLATFORMS", "DeviceList", "parse_devices"]
