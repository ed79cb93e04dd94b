"""Value targets on splice's data as it comes: returns, n-step, TD(λ), GAE, V-trace, Retrace.

Every function takes a batch of steps (a TensorDict, time along its **last** batch dim) and
value estimates, and returns targets with the reward's shape ``[*batch, 1]``. The same call
works on every layout splice produces:

* a collector chunk ``[B, T]`` (or ``[T]``): episodes end inside rows, the last one is cut at
  the batch edge (``("collector", "cut")``) and goes on in the next batch;
* padded trajectories ``[N, L]`` with ``("collector", "mask")`` (``split_trajectories``,
  ``trajs_per_batch``);
* the flat "cat" layout ``[N]`` (``cat_trajectories``), trajectories told apart by
  ``("collector", "traj_ids")``;
* sampled slices ``[S, L]`` (``SliceSampler(as_sequences=True)``: left-aligned, mask and
  burn-in mask) or their flat ``[S * L]`` form.

**The rule.** A step's target runs on into the next position of its row when that position
is the same trajectory's next step: both are real steps (mask), the ids agree (when there are
ids), and the step is neither an episode end (``terminated``, ``truncated`` or ``done``) nor
a cut. Where it does not run on, the target *bootstraps*: from ``next_value`` — the value of
the step's ``("next", "observation")`` — unless the step is **terminated** (no bootstrap).
So a **truncated** step bootstraps from its true final observation, a **cut** step from the
observation the episode continues from, a slice's last step from the state after it, and
padding or another trajectory's steps never enter a target. Data collected with
``set_truncated=True`` (done and truncated also set at cuts) gives the same targets: both
marks mean "bootstrap from the next observation". The formulas are on the docs page
"Value targets".

``value`` is ``V(observation)`` and ``next_value`` is ``V(("next", "observation"))`` for
every step (``[*batch]`` or ``[*batch, 1]``); inside an episode ``next_value[t]`` is
``value[t + 1]``, at an episode's end it is the value of the true final observation, which
only ``next_value`` holds. A terminated step's ``next_value`` is never read (it may be any
finite or non-finite number). Targets are constants: they are computed without gradient.
:func:`vtrace` and :func:`retrace` also take the log-probabilities of the taken actions under
the policy being learned and the behaviour policy.

**Where it runs.** On CPU tensors each target is a compiled loop over time (numba; compiled
on the first call for each dtype and cached on disk, so later processes load it); on an
accelerator, whole-tensor torch operations (a parallel scan). Both give the same targets.

Examples:
    A chunk of one env: an episode ends (truncated) at step 1, the next is cut at step 2.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> from splice import targets
    >>> flag = lambda *x: torch.tensor(x).unsqueeze(-1)
    >>> batch = TensorDict({
    ...     ("next", "reward"): torch.ones(3, 1),
    ...     ("next", "terminated"): flag(False, False, False),
    ...     ("next", "truncated"): flag(False, True, False),
    ...     ("collector", "traj_ids"): torch.tensor([7, 7, 8]),
    ...     ("collector", "cut"): torch.tensor([False, False, True]),
    ... }, batch_size=[3])
    >>> next_value = torch.tensor([10.0, 20.0, 30.0])
    >>> targets.td_lambda_return(batch, next_value, gamma=0.5, lmbda=1.0).squeeze(-1)
    tensor([ 6.5000, 11.0000, 16.0000])
"""

from splice.targets._inputs import TargetKeys
from splice.targets.off_policy import retrace, vtrace
from splice.targets.returns import (
    continues,
    discounted_return,
    gae,
    n_step_return,
    td_lambda_return,
)

__all__ = [
    "TargetKeys",
    "continues",
    "discounted_return",
    "gae",
    "n_step_return",
    "retrace",
    "td_lambda_return",
    "vtrace",
]
