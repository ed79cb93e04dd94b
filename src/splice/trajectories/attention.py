"""``attention_mask``: which steps each step of a sequence may attend to — causal, within
its episode, over a window of the steps before it."""

from __future__ import annotations

import torch
from torch import Tensor

from splice._args import non_negative_int
from splice.layout import is_integer_dtype

__all__ = ["attention_mask"]


def attention_mask(
    valid: Tensor, *, window: int | None = None, episode: Tensor | None = None
) -> Tensor:
    """The causal attention mask of sequences of steps, ``[..., T, T]``: entry ``[..., q, k]``
    is True where step ``q`` may attend to step ``k`` (PyTorch's boolean convention for
    ``torch.nn.functional.scaled_dot_product_attention``; ``nn.MultiheadAttention`` and
    ``nn.TransformerEncoder`` take the opposite one: pass ``~mask`` there).

    Step ``q`` attends to step ``k`` when ``k`` is a real step (``valid``), ``k <= q``, at
    most ``window`` steps before ``q`` (if given), and of the same episode (if ``episode``
    is given). Every step also attends to itself, padding included, so that no row of the
    mask is empty (an empty row makes softmax attention NaN); a padding step's output is
    meant to be left out of the loss.

    With ``window=K`` a step sees itself and the ``K`` steps before it: the window a policy
    with a context of ``K`` steps saw when it acted. On a replay sample drawn with
    ``SliceSampler(burn_in=K, ...)`` (either ``burn_in_align``), ``valid`` is the sample's
    ``("collector", "mask")`` and no ``episode`` is needed: a slice never holds more than one
    episode, and its first ``K`` steps before the training steps are exactly the stored
    steps of that episode before them. For batches that hold several episodes per row (a
    collector's ``[B, T]`` batch), pass their trajectory ids as ``episode``.

    Args:
        valid: bool ``[..., T]``: True on real steps.
        window: how many steps before itself a step may attend to (None: all of them).
        episode: integer ``[..., T]`` (the shape of ``valid``): steps attend only to steps
            with the same value (e.g. ``("collector", "traj_ids")``).

    Returns:
        bool ``[..., T, T]`` on ``valid``'s device.

    Raises:
        TypeError: ``valid`` is not a bool tensor, ``episode`` not an integer tensor, or
            ``window`` not an int.
        ValueError: ``valid`` has no time dim, ``episode`` another shape, or ``window < 0``.

    Examples:
        Training step ``j`` of a right-aligned sample is at column ``K + j``; it attends to
        the steps before it that are stored in its episode (here one slice, ``K = 2``, one
        step of context stored: column 0 is padding):

        >>> valid = torch.tensor([[False, True, True, True]])
        >>> attention_mask(valid, window=2)[0].int()
        tensor([[1, 0, 0, 0],
                [0, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 1, 1, 1]], dtype=torch.int32)

        Two episodes in one row: no step attends across the start of the second.

        >>> ids = torch.tensor([7, 7, 8, 8])
        >>> attention_mask(torch.ones(4, dtype=torch.bool), episode=ids).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 0, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool:
        got = valid.dtype if isinstance(valid, Tensor) else type(valid).__name__
        raise TypeError(f"valid must be a bool tensor, got {got}")
    if valid.dim() < 1:
        raise ValueError("valid must have a time dim ([..., T]), got a scalar")
    if window is not None:
        window = non_negative_int("window", window)
    T = valid.shape[-1]
    step = torch.arange(T, device=valid.device)
    behind = step[:, None] - step[None, :]  # q - k
    allowed = behind >= 0
    if window is not None:
        allowed &= behind <= window
    mask = allowed & valid[..., None, :] & valid[..., :, None]
    if episode is not None:
        if not isinstance(episode, Tensor) or not is_integer_dtype(episode.dtype):
            got = episode.dtype if isinstance(episode, Tensor) else type(episode).__name__
            raise TypeError(f"episode must be an integer tensor, got {got}")
        if episode.shape != valid.shape:
            raise ValueError(
                f"episode must have the shape of valid {list(valid.shape)}, got "
                f"{list(episode.shape)}"
            )
        mask &= episode[..., :, None] == episode[..., None, :]
    return mask | torch.eye(T, dtype=torch.bool, device=valid.device)
