"""The chaos soak's arithmetic on a run's records and summary (pure: no processes, no
clock): recovery times, fresh samples/s and its series, the samples a killed learner took
with it, the accounting, percentiles. experiments/studies/chaos/chaos.py says what each
figure means."""

from __future__ import annotations

import numpy as np

from tianjax.metrics import read_metrics


def all_records(run_dir: str) -> list[dict]:
    """Every record any learner incarnation wrote (the kept history and what a killed
    learner wrote after its last checkpoint), in the order of the shared clock."""
    recs = read_metrics(run_dir) + read_metrics(run_dir, "metrics.superseded.jsonl")
    return sorted((r for r in recs if "unix_time" in r), key=lambda r: r["unix_time"])


def recovery_s(fault: dict, records: list[dict]) -> float | None:
    """Seconds from a fault (a kill) or its end (a stop, cut or cap) to its recovery: the
    first admission of the actor's id after it, or the learner's first record after it
    (its next incarnation's first update). None: not recovered in these records."""
    t = fault["end"]
    if fault["kind"] == "learner_kill":
        after = [r["unix_time"] for r in records if r["unix_time"] > t]
        return after[0] - t if after else None
    key = str(fault["actor"])
    for r in records:
        at = r.get("actor_admitted_at", {}).get(key)
        if at is not None and at > t:
            return at - t
    return None


def fresh_rate(records: list[dict]) -> float | None:
    """Fresh samples per second of training over the kept history: the samples the final
    parameters first learned from, over the shared clock from its first to its last record."""
    if len(records) < 2 or records[-1]["unix_time"] <= records[0]["unix_time"]:
        return None
    return (records[-1]["samples_fresh"] - records[0]["samples_fresh"]) / (
        records[-1]["unix_time"] - records[0]["unix_time"]
    )


def rate_series(records: list[dict], t0: float, bin_s: float = 5.0) -> tuple[list, list]:
    """(bin starts in seconds from t0, fresh samples/s in each), from every record: within
    one incarnation the fresh count rises; a learner's restart sets it back (rolled back
    work), and that step is not a rate."""
    edges: dict[int, float] = {}
    for a, b in zip(records, records[1:]):
        d = b["samples_fresh"] - a["samples_fresh"]
        if d > 0:
            k = int((b["unix_time"] - t0) // bin_s)
            edges[k] = edges.get(k, 0.0) + d
    if not edges:
        return [], []
    ks = range(0, max(edges) + 1)
    return [(k + 0.5) * bin_s for k in ks], [edges.get(k, 0.0) / bin_s for k in ks]


def rolled_back(faults: list[dict], kept: list[dict], records: list[dict]) -> list[int]:
    """For each learner kill, the samples that learner had admitted since its last
    checkpoint: its newest record's count against the kept history's last record before the
    kill (the checkpoint its successor resumed from; metrics.jsonl keeps up to it)."""
    out = []
    for f in faults:
        if f["kind"] != "learner_kill":
            continue
        before = [r for r in records if r["unix_time"] < f["start"]]
        kept_before = [r for r in kept if r["unix_time"] < f["start"]]
        if not before or not kept_before:
            out.append(0)
            continue
        out.append(int(before[-1]["samples_produced"] - kept_before[-1]["samples_produced"]))
    return out


def accounting(summary: dict, kept: list[dict], traj_steps: int, lost_with_learner) -> dict:
    """The final learner incarnation's ledger, in trajectories and samples (see the module
    doc). `closes`: trajectories received x steps == samples admitted + dropped on arrival,
    each drop by its reason."""
    resumed = summary.get("resumed_from_step")
    base = {"env_steps": 0, "dropped_samples": 0, "expired_samples": 0}
    if resumed is not None:
        at = [r for r in kept if r["updates"] == resumed]
        if at:
            base = at[-1]
    bal = summary["balance"]
    admitted = summary["env_steps"] - base["env_steps"]
    stale_or_budget = (bal["dropped_samples"] - bal["expired_samples"]) - (
        base["dropped_samples"] - base.get("expired_samples", 0)
    )
    nonfinite = summary["dropped_nonfinite"] * traj_steps
    bad_versions = summary["dropped_bad_versions"] * traj_steps
    received = summary["trajectories_received"]
    # accepted by the learner's receiver but not yet taken when the run stopped
    unread = summary.get("trajectories_unread_at_stop", 0)
    written_off = summary["trajectories_written_off"]
    by_actor = summary.get("trajectories_by_actor", {})
    # what each actor id's current process said it sent arrived here (learned from,
    # dropped, or unread at the stop) or was written off
    unaccounted = {
        a: c["sent"] - arrived - written_off
        for a, c in by_actor.items()
        if c.get("sent") is not None
        and c["sent"] > (arrived := c["received"] + c.get("unread_at_stop", 0)) + written_off
    }
    return {
        "since_update": resumed or 0,
        "trajectories_received": received,
        "samples_received": received * traj_steps,
        "samples_admitted": admitted,
        "dropped_on_arrival": {
            "too_stale_or_beyond_budget": stale_or_budget,
            "nonfinite": nonfinite,
            "bad_versions": bad_versions,
        },
        "expired_in_pool_total": bal["expired_samples"],
        "trajectories_written_off": written_off,
        "samples_lost_with_killed_learners": list(lost_with_learner),
        "rejected_messages": summary["rejected_messages"],
        "rejected_by_reason": summary.get("rejected_by_reason", {}),
        "by_actor": by_actor,
        "sent_unaccounted_by_actor": unaccounted,
        "unread_at_stop": unread * traj_steps,
        "closes": received * traj_steps
        == admitted + stale_or_budget + nonfinite + bad_versions + unread * traj_steps
        and not unaccounted,
    }


def percentiles(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    return {
        "n": len(vals),
        "p50": float(np.percentile(vals, 50)),
        "p95": float(np.percentile(vals, 95)),
        "max": max(vals),
    }
