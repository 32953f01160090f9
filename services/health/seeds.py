"""Failure prediction over several seeds: the student against the LSTM, seed by seed.

One seed's figures move with the draw of modules (docs/health.md: the student's lead
on seeds 0-2 was within seed-to-seed variation), so the comparison that counts is over
a range of seeds: the mean and spread of each method's module-level F1, how many seeds
the student wins, and the false alarms of each. Pure: no torch, no grpc.
"""

from __future__ import annotations

import numpy as np

# The goal the comparison is held to, fixed before any multi-seed figure was seen.
GOAL_WINS = 0.9  # share of seeds the student must win on module F1
GOAL_MARGIN = 0.02  # mean module-F1 lead over the LSTM
STUDENT, LSTM = "fgl_student", "lstm"


def parse_seeds(text: str) -> list[int]:
    """'0-9' or '3,5,7-8' -> sorted distinct seeds. Raises ValueError naming the bad part."""
    seeds: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a, b = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise ValueError(f"--seeds: {part!r} is not a seed or a range like 0-9") from None
        if a < 0 or b < a:
            raise ValueError(f"--seeds: {part!r} is not an increasing range of seeds >= 0")
        seeds.update(range(a, b + 1))
    return sorted(seeds)


def summarise(per_seed: dict[int, dict]) -> dict:
    """``per_seed[seed]`` is one prediction run's result (``methods`` -> ``entity``).

    Returns per method the mean, standard deviation, minimum and maximum of module F1
    and the total false alarms, then the student's wins, ties and losses against the
    LSTM and whether the goal holds (wins on >= 90% of seeds, mean margin >= 0.02, no
    more false alarms in total)."""
    seeds = sorted(per_seed)
    methods = list(per_seed[seeds[0]]["methods"])
    out: dict = {"seeds": seeds, "methods": {}}
    for m in methods:
        f1 = np.array([per_seed[s]["methods"][m]["entity"]["f1"] for s in seeds])
        fa = [per_seed[s]["methods"][m]["entity"]["false_alarms"] for s in seeds]
        out["methods"][m] = {
            "f1_mean": float(f1.mean()),
            "f1_std": float(f1.std(ddof=1)) if len(f1) > 1 else 0.0,
            "f1_min": float(f1.min()),
            "f1_max": float(f1.max()),
            "false_alarms": float(sum(fa)),
            "f1_per_seed": [float(v) for v in f1],
        }
    if STUDENT in out["methods"] and LSTM in out["methods"]:
        out["student_vs_lstm"] = _compare(out["methods"][STUDENT], out["methods"][LSTM])
    return out


def _compare(st: dict, ls: dict) -> dict:
    diff = np.array(st["f1_per_seed"]) - np.array(ls["f1_per_seed"])
    wins, ties = int((diff > 1e-9).sum()), int((np.abs(diff) <= 1e-9).sum())
    margin = float(diff.mean())
    goal = {
        "wins": wins >= GOAL_WINS * len(diff),
        "margin": margin >= GOAL_MARGIN,
        "false_alarms": st["false_alarms"] <= ls["false_alarms"],
    }
    return {
        "wins": wins,
        "ties": ties,
        "losses": len(diff) - wins - ties,
        "mean_margin": margin,
        "margin_per_seed": [float(d) for d in diff],
        "goal": {**goal, "met": all(goal.values())},
    }
