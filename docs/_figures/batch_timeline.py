"""Figure: a [3, 16] collector batch, its trajectories, ends and cuts."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

# Three env rows, 16 steps. Each row: list of (traj id, length, how it ends).
ROWS = [
    [(0, 5, "terminated"), (3, 7, "truncated"), (6, 4, "cut")],
    [(1, 9, "terminated"), (5, 7, "cut")],
    [(2, 6, "truncated"), (4, 10, "cut")],
]
COLORS = plt.get_cmap("tab10")

fig, ax = plt.subplots(figsize=(9, 2.6))
for env, row in enumerate(ROWS):
    t = 0
    for traj, length, end in row:
        for k in range(length):
            ax.add_patch(Rectangle((t + k, env), 0.94, 0.8, color=COLORS(traj), alpha=0.75, lw=0))
        last = t + length - 1
        ax.text(t + (length - 1) / 2, env + 0.4, f"id {traj}", ha="center", va="center", fontsize=8)
        if end == "cut":
            ax.plot([last + 0.97, last + 0.97], [env - 0.05, env + 0.85], color="crimson", lw=2.5)
        else:
            ax.text(
                last + 0.47,
                env + 0.4,
                {"terminated": "X", "truncated": "T"}[end],
                ha="center",
                va="center",
                fontsize=11,
                fontweight="bold",
                color="white",
            )
        t += length
ax.set_xlim(-0.2, 16.2)
ax.set_ylim(-0.1, 2.9)
ax.set_yticks(np.arange(3) + 0.4, [f"env {b}" for b in range(3)])
ax.set_xticks(np.arange(16) + 0.47, [str(t) for t in range(16)], fontsize=7)
ax.set_xlabel("time step t within the batch")
ax.invert_yaxis()
for side in ("top", "right", "left"):
    ax.spines[side].set_visible(False)
ax.set_title(
    "X: terminated (done)   T: truncated by a time limit (done)   "
    "red bar: cut by the collector (not done; continues next batch)",
    fontsize=8,
)
fig.tight_layout()
