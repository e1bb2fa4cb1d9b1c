"""The sequential rule of ``drift --until-clear`` on simulated metric streams (no training): how often
it declares a difference, and how many runs it spends, against the fixed design of the same power.

    PYTHONPATH=src python bench/drift_sequential.py

Prints the two Markdown tables of docs/drift.md. Paired differences ``effect + noise`` (effect in
standard deviations of the paired difference; noise normal or Student t with 3 degrees of freedom,
scaled to std 1), 2000 experiments each, looked at after every batch of pairs, up to a budget of
6 × the pairs a fixed paired t-test needs for 80 % power at 1 sd (60 pairs); the fixed design of
the same power: the fewest pairs at which the paired t-test (α 0.05, two-sided), on the same
streams, is right as often. Variance shares: two crossed random factors grown one level each at a
time from 2 to 12 levels (4 to 144 runs), A with σ²_A / σ²_error = ratio.
"""

from __future__ import annotations

import time

from torchrepro.analysis.sequential import simulate_paired, simulate_shares

EFFECTS = (0.0, 0.5, 1.0, 2.0)  # null, small, medium, large (sd of the paired difference)
BUDGET = 60


def paired_table() -> list[str]:
    rows = [
        "| noise | effect (sd) | batch (pairs) | declared | right decision | mean pairs | median | fixed design, same power |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for noise in ("normal", "t3"):
        for effect in EFFECTS:
            for batch in (1, 4):
                r = simulate_paired(effect, 1.0, max_pairs=BUDGET, batch=batch, noise=noise)
                fixed = "—" if not effect else (str(r["fixed_pairs"]) if r["fixed_pairs"] else f"> {BUDGET}")
                rows.append(
                    f"| {noise} | {effect:g} | {batch} | {100 * r['declared']:.1f} % | {100 * r['correct']:.1f} % "
                    f"| {r['mean_pairs']:.1f} | {r['median_pairs']:.0f} | {fixed} |"
                )
    return rows


def shares_table() -> list[str]:
    rows = [
        "| noise | σ²_A / σ²_error | declared | mean runs | fixed design, same power (runs) |",
        "|---|---|---|---|---|",
    ]
    for noise in ("normal", "t3"):
        for ratio in (0.0, 0.25, 1.0, 4.0):
            r = simulate_shares(ratio, max_levels=12, noise=noise)
            fixed = "—" if not ratio else (str(r["fixed_runs"]) if r["fixed_runs"] else "> 144")
            rows.append(f"| {noise} | {ratio:g} | {100 * r['declared']:.1f} % | {r['mean_runs']:.0f} | {fixed} |")
    return rows


if __name__ == "__main__":
    t0 = time.perf_counter()
    print("\n".join(paired_table()))
    print()
    print("\n".join(shares_table()))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
