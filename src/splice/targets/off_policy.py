"""Off-policy corrections: V-trace (IMPALA) for actor-critics, Retrace for Q-learning.

Both weigh each step by the importance ratio :math:`\\pi(a_t|s_t) / \\mu(a_t|s_t)` of the
policy being learned (:math:`\\pi`, ``log_pi``) to the behaviour policy that chose the action
(:math:`\\mu`, ``log_mu``, by default read from the batch at ``"action_log_prob"``), clipped,
and follow the same end rules as the other targets.
"""

from __future__ import annotations

from tensordict import TensorDictBase
from torch import Tensor

from splice.targets import _backend
from splice.targets._inputs import (
    Rows,
    TargetKeys,
    check_rate,
    check_threshold,
    read,
    tensor,
    work_dtype,
)


def vtrace(
    td: TensorDictBase,
    value: Tensor | None = None,
    next_value: Tensor | None = None,
    *,
    log_pi: Tensor | None = None,
    log_mu: Tensor | None = None,
    log_rho: Tensor | None = None,
    gamma: float,
    rho_thresh: float = 1.0,
    c_thresh: float = 1.0,
    keys: TargetKeys | None = None,
) -> tuple[Tensor, Tensor]:
    r"""V-trace value targets and policy-gradient advantages (Espeholt et al., 2018).

    With the clipped importance weights :math:`\rho_t = \min(\bar\rho, \pi_t / \mu_t)` and
    :math:`\kappa_t = \min(\bar c, \pi_t / \mu_t)`, :math:`c_t` from :func:`continues` (1
    where the target runs on into :math:`t + 1`) and :math:`d_t` = ``terminated``:

    * :math:`\delta_t = \rho_t (r_t + \gamma (1 - d_t) V'_t - V_t)`,
    * :math:`v_t = V_t + \delta_t + \gamma \kappa_t c_t (v_{t+1} - V_{t+1})`, the value
      target,
    * :math:`A_t = \rho_t (r_t + \gamma \tilde v_{t+1} - V_t)`, the policy-gradient
      advantage, where :math:`\tilde v_{t+1} = v_{t+1}` while the target runs on and
      :math:`(1 - d_t) V'_t` where it stops.

    So a truncated step bootstraps from its true final observation, a cut step from the
    observation the episode continues from, and padding and other trajectories never enter a
    target. With :math:`\pi = \mu` and :math:`\bar c \ge 1` the value target is
    :func:`gae`'s with ``lmbda=1``, and so is the advantage when ``next_value[t]`` is
    ``value[t + 1]`` inside episodes (a feed-forward critic).

    Args:
        td: the batch (any layout of :mod:`splice.targets`).
        value: :math:`V(s_t)` per step, ``[*batch]`` or ``[*batch, 1]``; default: read from
            ``keys.value`` (``"state_value"``).
        next_value: :math:`V(s'_t)` per step; default: read from ``keys.next_value``.
        log_pi: :math:`\log \pi(a_t | s_t)`, the log-probability of each taken action under
            the policy being learned (``[*batch]`` or ``[*batch, 1]``; sum the
            per-dimension log-probabilities of a multi-dimensional action). Required unless
            ``log_rho`` is given.
        log_mu: :math:`\log \mu(a_t | s_t)` under the behaviour policy; default: read from
            ``keys.sample_log_prob`` (``"action_log_prob"``, which the collecting policy
            writes).
        log_rho: instead of ``log_pi`` and ``log_mu``: the log importance ratio
            :math:`\log \pi_t - \log \mu_t`.
        gamma: discount, in ``[0, 1]``.
        rho_thresh: :math:`\bar\rho`, ``> 0`` (TorchRL's name; ``math.inf``: no clipping).
        c_thresh: :math:`\bar c`, ``> 0``.
        keys: where to read the inputs (:class:`TargetKeys`).

    Returns:
        ``(advantage, value_target)``, each ``[*batch, 1]``, zero on padding.

    Raises:
        TypeError: as :func:`gae`; a log-probability is not a float tensor.
        ValueError: as :func:`gae`; ``rho_thresh`` or ``c_thresh`` is ``<= 0``; neither
            ``log_pi`` nor ``log_rho``, or both, are given; the behaviour log-probability is
            neither given nor in the batch (:class:`~splice.LayoutError`, naming the key).

    Examples:
        Two steps of one episode, cut at the second; the learned policy likes the first
        action twice as much as the behaviour policy did, the second half as much.

        >>> import math, torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({
        ...     ("next", "reward"): torch.ones(2, 1),
        ...     ("next", "terminated"): torch.zeros(2, 1, dtype=torch.bool),
        ...     ("next", "done"): torch.zeros(2, 1, dtype=torch.bool),
        ...     ("collector", "cut"): torch.tensor([False, True]),
        ...     "action_log_prob": torch.log(torch.tensor([0.25, 0.5])),
        ... }, batch_size=[2])
        >>> log_pi = torch.log(torch.tensor([0.5, 0.25]))
        >>> value, next_value = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])
        >>> adv, target = vtrace(batch, value, next_value, log_pi=log_pi, gamma=0.5)
        >>> target.squeeze(-1), adv.squeeze(-1)
        (tensor([2.2500, 2.5000]), tensor([1.2500, 0.5000]))
    """
    keys = keys or TargetKeys()
    gamma = check_rate("gamma", gamma)
    rho_thresh = check_threshold("rho_thresh", rho_thresh)
    c_thresh = check_threshold("c_thresh", c_thresh)
    rows = read(td, keys)
    v = tensor(td, rows, value, keys.value, "value")
    nv = tensor(td, rows, next_value, keys.next_value, "next_value")
    lp, lm = _log_probs(td, rows, keys, log_pi, log_mu, log_rho)
    dtype, work = work_dtype(v, nv, *([lp] if lm is None else [lp, lm]))
    advantage, value_target = _backend.for_device(rows.device).vtrace(
        rows,
        rows.reward.to(work),
        v.to(work),
        nv.to(work),
        lp.to(work),
        None if lm is None else lm.to(work),
        gamma,
        rho_thresh,
        c_thresh,
    )
    return rows.output(advantage, dtype), rows.output(value_target, dtype)


def retrace(
    td: TensorDictBase,
    state_action_value: Tensor | None = None,
    next_value: Tensor | None = None,
    *,
    log_pi: Tensor | None = None,
    log_mu: Tensor | None = None,
    log_rho: Tensor | None = None,
    gamma: float,
    lmbda: float = 1.0,
    c_thresh: float = 1.0,
    keys: TargetKeys | None = None,
) -> Tensor:
    r"""Retrace targets for :math:`Q(s_t, a_t)` (Munos et al., 2016).

    With the traces :math:`\kappa_t = \lambda \min(\bar c, \pi_t / \mu_t)`, :math:`c_t` from
    :func:`continues` (1 where the target runs on into :math:`t + 1`) and :math:`d_t` =
    ``terminated``:

    .. math::

        Q^{ret}_t = r_t + \gamma (1 - d_t) V'_t
            + \gamma\, c_t\, \kappa_{t+1} (Q^{ret}_{t+1} - Q(s_{t+1}, a_{t+1}))

    where :math:`V'_t = \mathbb{E}_{a \sim \pi} Q(s'_t, a)` is the expected value of the
    step's next observation under the policy being learned (for a greedy policy,
    :math:`\max_a Q(s'_t, a)`; usually from a target network). Where the target stops it is
    the one-step target :math:`r_t + \gamma (1 - d_t) V'_t`: a truncated step bootstraps
    from its true final observation, a cut step from the observation the episode continues
    from, and padding and other trajectories never enter a target. ``lmbda=0`` gives
    one-step (expected SARSA) targets; with :math:`\pi = \mu` and :math:`\bar c \ge 1`,
    Retrace is Q(λ) with expected values.

    Args:
        td: the batch (any layout of :mod:`splice.targets`).
        state_action_value: :math:`Q(s_t, a_t)` per step, ``[*batch]`` or ``[*batch, 1]``;
            default: read from ``keys.state_action_value`` (``"state_action_value"``).
        next_value: :math:`V'_t = \mathbb{E}_{a \sim \pi} Q(s'_t, a)` per step; default:
            read from ``keys.next_value`` (``("next", "state_value")``).
        log_pi: :math:`\log \pi(a_t | s_t)` under the policy being learned (for a greedy
            policy: 0 where the action is greedy, ``-inf`` elsewhere). Required unless
            ``log_rho`` is given.
        log_mu: :math:`\log \mu(a_t | s_t)` under the behaviour policy; default: read from
            ``keys.sample_log_prob`` (``"action_log_prob"``).
        log_rho: instead of ``log_pi`` and ``log_mu``: the log importance ratio.
        gamma: discount, in ``[0, 1]``.
        lmbda: the trace's :math:`\lambda`, in ``[0, 1]``.
        c_thresh: :math:`\bar c`, ``> 0`` (1 in the paper).
        keys: where to read the inputs (:class:`TargetKeys`).

    Returns:
        ``[*batch, 1]`` targets, zero on padding.

    Raises:
        TypeError, ValueError: as :func:`vtrace`.

    Examples:
        Three steps of one episode (terminated at the last); the policy being learned is
        greedy and the behaviour took a non-greedy action at step 1, which cuts the trace
        there.

        >>> import math, torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({
        ...     ("next", "reward"): torch.ones(3, 1),
        ...     ("next", "terminated"): torch.tensor([[False], [False], [True]]),
        ...     ("next", "done"): torch.tensor([[False], [False], [True]]),
        ...     "action_log_prob": torch.log(torch.tensor([0.9, 0.1, 0.9])),
        ... }, batch_size=[3])
        >>> log_pi = torch.tensor([0.0, -math.inf, 0.0])
        >>> q, next_value = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 3.0, 0.0])
        >>> retrace(batch, q, next_value, log_pi=log_pi, gamma=0.5).squeeze(-1)
        tensor([2.0000, 1.5000, 1.0000])
    """
    keys = keys or TargetKeys()
    gamma, lmbda = check_rate("gamma", gamma), check_rate("lmbda", lmbda)
    c_thresh = check_threshold("c_thresh", c_thresh)
    rows = read(td, keys)
    q = tensor(td, rows, state_action_value, keys.state_action_value, "state_action_value")
    nv = tensor(td, rows, next_value, keys.next_value, "next_value")
    lp, lm = _log_probs(td, rows, keys, log_pi, log_mu, log_rho)
    dtype, work = work_dtype(q, nv, *([lp] if lm is None else [lp, lm]))
    out = _backend.for_device(rows.device).retrace(
        rows,
        rows.reward.to(work),
        q.to(work),
        nv.to(work),
        lp.to(work),
        None if lm is None else lm.to(work),
        gamma,
        lmbda,
        c_thresh,
    )
    return rows.output(out, dtype)


_HOW_TO_GET_LOG_MU = (
    ": it is the behaviour policy's log-probability of each action, which the policy that "
    "collected the data must write (TorchRL's ProbabilisticActor(return_log_prob=True) and "
    "splice's ModulePolicy(output='sample') write 'action_log_prob'); pass log_mu=..., or "
    "name the key with TargetKeys(sample_log_prob=...)"
)


def _log_probs(
    td: TensorDictBase,
    rows: Rows,
    keys: TargetKeys,
    log_pi: Tensor | None,
    log_mu: Tensor | None,
    log_rho: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """``(log_pi, log_mu)`` as rows, or ``(log_rho, None)``."""
    if log_rho is not None:
        if log_pi is not None or log_mu is not None:
            raise ValueError("give log_rho or log_pi (and log_mu), not both")
        return tensor(td, rows, log_rho, "", "log_rho"), None
    if log_pi is None:
        raise ValueError(
            "log_pi is required (the log-probability of each taken action under the policy "
            "being learned), or log_rho (the log importance ratio)"
        )
    lp = tensor(td, rows, log_pi, "", "log_pi")
    return lp, tensor(td, rows, log_mu, keys.sample_log_prob, "log_mu", _HOW_TO_GET_LOG_MU)
