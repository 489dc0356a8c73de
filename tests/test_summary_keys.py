"""summary.json's keys, held by a golden file: what a fused run and an in-process sync
(host) run write must not change when the code behind it does (tools and notebooks read
these keys). A new key is added to tests/golden/summary_keys.json on purpose."""

import json
from pathlib import Path

import pytest

import tianjax

GOLDEN = Path(__file__).parent / "golden" / "summary_keys.json"

RUNS = {
    "fused": ("configs/ppo_cartpole.yaml", ["total_env_steps=1024", "eval.episodes=2"]),
    "host": (
        "configs/ppo_cartpole_gymnasium.yaml",
        [
            "num_actors=0",
            "num_envs=4",
            "rollout_len=16",
            "total_env_steps=128",
            "ppo.num_minibatches=2",
        ],
    ),
}


def summary_keys(kind: str, run_dir: Path) -> list[str]:
    config, overrides = RUNS[kind]
    tianjax.train(
        config,
        [*overrides, "log_every=1", "compile_cache=null"],
        run_dir=str(run_dir),
        verbose=False,
        progress=False,
    )
    with open(run_dir / "summary.json") as f:
        return sorted(json.load(f))


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_summary_json_keeps_its_keys(kind, tmp_path):
    golden = json.loads(GOLDEN.read_text())[kind]
    keys = summary_keys(kind, tmp_path / kind)
    assert keys == golden, (
        f"summary.json of a {kind} run: added {sorted(set(keys) - set(golden))}, "
        f"lost {sorted(set(golden) - set(keys))}"
    )


if __name__ == "__main__":  # writes the golden file from this tree's runs
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        GOLDEN.write_text(
            json.dumps({k: summary_keys(k, Path(d) / k) for k in sorted(RUNS)}, indent=1) + "\n"
        )
