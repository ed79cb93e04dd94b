"""The normalized step stream every environment adapter provides to the collector loop.

An adapter wraps one gymnasium ``Env`` (seen as one env) or one ``VectorEnv`` (``B`` envs) and
writes each step straight into the collector's staging arrays. Whatever the env's autoreset
mode, the loop sees the same stream:

* ``adapter.obs`` — the observation leaves *entering* the next step (a reset observation where
  an episode restarts), followed by the requested ``info`` entries that came with them;
* ``adapter.step(action, c)`` writes, at staging column ``c``, the TRUE next observation (the
  final one at an episode's end) and the info of that step, the reward and the
  terminated/truncated flags (the loop clears the flags of a column before handing it out, so
  an adapter may write the True ones only), and returns
  ``None`` when no env restarted, else a bool mask ``[B]``:

  - for an adapter with ``dead_steps = False``: the envs whose episode ended at ``c`` and that
    were already reset (their next step starts a new episode);
  - for an adapter with ``dead_steps = True`` (gymnasium's NEXT_STEP autoreset): the envs for
    which column ``c`` was a *dead* reset step — the action was ignored and the env only
    returned its reset observation. The loop drops those columns; their next step starts a new
    episode.

Where ``step`` returns ``None`` (no env restarted), ``adapter.obs`` afterwards holds exactly the
values it wrote at ``c`` (the next observation and info leaves): the collector relies on it and
writes the entering values only where an episode starts (``Staging.fill_entering``).

Staging arrays are time-major, ``[C, B, *leaf_shape]``; a single env writes into ``B = 1`` by
numpy broadcasting.

Examples:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> from splice.envs import make_adapter
    >>> adapter = make_adapter(gym.make("CartPole-v1"))
    >>> adapter.num_envs, adapter.batched, adapter.dead_steps
    (1, False, False)
    >>> adapter.bind(adapter.allocate(capacity=4))
    >>> adapter.reset(seed=0)
    >>> adapter.step(1, 0) is None  # the episode goes on
    True
    >>> adapter.staging.reward[0]
    array([1.], dtype=float32)
    >>> adapter.close()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from splice.envs.errors import EnvError
from splice.envs.infos import InfoReader, parse_info_keys
from splice.envs.spaces import (
    OBJECT,
    Leaf,
    action_leaf,
    flattener,
    observation_leaves,
    select_leaves,
)

__all__ = ["EnvAdapter", "EnvError", "StepTargets"]

#: Item formats whose memoryview assignment stores what numpy's does: integers and bools
#: converted like numpy converts them (``__index__``, truth value; out-of-range or
#: non-integer values raise instead), float64 through ``__float__``. Not float32/float16:
#: numpy casts an integer scalar to them without going through a float64.
_EXACT_ITEM_FORMATS = frozenset("?bBhHiIlLqQd")
#: What a memoryview item assignment raises for a value numpy would cast or reject.
ITEM_ERRORS = (TypeError, ValueError, OverflowError)


def item_writer(column: np.ndarray) -> Any:
    """``column`` (a ``[C]`` staging view) as a memoryview when it can take ``view[c] =
    value`` for a scalar at about half of numpy's cost (50-90 ns instead of 100-200 ns), else
    the array itself (``[C, ...]`` views, float32, object). A write the memoryview refuses
    raises one of :data:`ITEM_ERRORS`: the caller then writes through the array (numpy's cast
    or numpy's error, as always) and keeps using the array.

    Examples:
        >>> col = np.zeros(4, np.int64)
        >>> view = item_writer(col)
        >>> view[1] = 7
        >>> view[2] = 2.5  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: memoryview: invalid type for format ...
        >>> col[2] = 2.5  # what the caller does then: numpy's cast
        >>> col
        array([0, 7, 2, 0])
        >>> isinstance(item_writer(np.zeros(4, np.float32)), np.ndarray)
        True
    """
    if (
        column.ndim == 1
        and column.flags.c_contiguous
        and column.dtype.isnative
        and column.dtype.char in _EXACT_ITEM_FORMATS
    ):
        view = column.data  # a memoryview of the array
        if view.format == column.dtype.char:
            return view
    return column


def write_item(writer: Any, column: np.ndarray, c: int, value: Any) -> Any:
    """Write ``value`` at ``c`` of ``column`` through ``writer`` (its :func:`item_writer`) and
    return the writer to use for that column from then on: ``writer``, or ``column`` once the
    memoryview refused a value (one of :data:`ITEM_ERRORS`), which then went through numpy's
    assignment (numpy's cast, or numpy's error, which propagates). The one implementation of
    that rule. Per-step callers try ``writer[c] = value`` inline and call this only when it
    raised one of :data:`ITEM_ERRORS` (it tries again, then falls back): a call per write
    costs 1-2% of a cheap env's step (``docs/design.md``).

    Examples:
        >>> col = np.zeros(3, np.int64)
        >>> w = item_writer(col)
        >>> w = write_item(w, col, 0, 7)
        >>> isinstance(w, memoryview)
        True
        >>> w = write_item(w, col, 1, 2.5)  # refused by the memoryview: numpy's cast
        >>> w is col, col
        (True, array([7, 2, 0]))
        >>> write_item(w, col, 2, "x")
        Traceback (most recent call last):
        ...
        ValueError: invalid literal for int() with base 10: 'x'
    """
    try:
        writer[c] = value
    except ITEM_ERRORS:
        column[c] = value
        return column
    return writer


@dataclass
class StepTargets:
    """The staging arrays an adapter writes each step's results into, time-major ``[C, B, ...]``
    (``[C, ...]`` views for one env). The collector owns them; the adapter only writes.

    Args:
        next_obs: one array per observation leaf (:attr:`EnvAdapter.obs_leaves`).
        reward: float32 ``[C, B]``.
        terminated: bool ``[C, B]``; False at every column the collector loop hands to
            :meth:`EnvAdapter.step` (it clears them first), so an adapter may write the True
            flags only.
        truncated: bool ``[C, B]``, like ``terminated``.
        next_info: one array per info leaf (:attr:`EnvAdapter.info_leaves`).
    """

    next_obs: list[np.ndarray]
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_info: list[np.ndarray] = field(default_factory=list)


class EnvAdapter(ABC):
    """One environment (or vector of environments) as a normalized step stream.

    Subclasses set, in ``__init__``: ``env``, ``num_envs``, ``batched``,
    ``single_observation_space``, ``single_action_space``, ``random_action_space``, ``dead_steps``,
    ``supports_partial_reset`` and ``autoreset_mode`` (a name for messages), then call
    :meth:`_init_spaces`.

    What each step carries besides the env's observation, reward and flags is chosen with
    :meth:`select` before the first reset: observation keys to leave out, and ``info`` entries
    to read (:mod:`splice.envs.infos`).
    """

    env: Any
    num_envs: int
    #: False for a single ``gymnasium.Env``: its batches are ``[T]``, not ``[1, T]``.
    batched: bool
    single_observation_space: spaces.Space[Any]
    single_action_space: spaces.Space[Any]
    #: The space random actions for all envs are drawn from (``init_random_frames``, no policy).
    random_action_space: spaces.Space[Any]
    #: True when the env inserts a dead reset step after each episode (NEXT_STEP autoreset).
    dead_steps: bool
    #: True when :meth:`reset_envs` can reset a subset of the envs.
    supports_partial_reset: bool
    autoreset_mode: str
    staging: StepTargets
    #: The values entering the next step: the observation leaves, then the info leaves.
    obs: list[Any]
    #: Validate the shapes of the next step's results (set by the loop once per batch).
    check_next: bool = True
    #: With ``dead_steps``: True when a row's dead step is always followed by the start of a
    #: new episode in that row (gymnasium's NEXT_STEP autoreset: :meth:`step` returns the dead
    #: rows, and they restart). False for an adapter whose rows may also be dead *within* an
    #: episode or between episodes (agent slots: another agent's turn, an empty slot): its
    #: :meth:`step` returns the dead rows and sets :attr:`starting`.
    dead_step_restarts: bool = True
    #: With ``dead_step_restarts = False``: after each :meth:`step`, the rows whose next step
    #: starts an episode (bool ``[B]``), or ``None`` for none.
    starting: np.ndarray | None = None
    #: False when an episode may have dead steps inside it (its steps are then not one run of
    #: consecutive staging columns): whole episodes are assembled from the batches.
    contiguous_episodes: bool = True

    def _init_spaces(self) -> None:
        self._all_obs_leaves: list[Leaf] = observation_leaves(self.single_observation_space)
        self.act_leaf: Leaf = action_leaf(self.single_action_space)
        self.infos = InfoReader([], num_envs=self.num_envs, batched=self.batched)
        self._set_obs_leaves(self._all_obs_leaves)
        self.obs = []

    def _set_obs_leaves(self, leaves: list[Leaf]) -> None:
        #: The observation leaves stored per step (keys below ``"observation"``).
        self.obs_leaves: list[Leaf] = leaves
        self._flatten = flattener(self.single_observation_space, leaves)
        self._object_obs = [i for i, leaf in enumerate(leaves) if not leaf.is_tensor]
        self._update_fast_path()

    def _update_fast_path(self) -> None:
        # The observation is one tensor leaf (not inside a Dict/Tuple): the step writes the
        # env's array directly.
        self._single_leaf = (
            len(self.obs_leaves) == 1 and self.obs_leaves[0].path == () and not self._object_obs
        )
        self._reads_info = bool(self.infos.keys)

    def select(
        self,
        *,
        exclude_keys: list[tuple[str, ...]] | None = None,
        info_keys: Any = None,
    ) -> None:
        """Choose what each step carries; call before the first :meth:`reset`.

        Args:
            exclude_keys: observation keys (full keys, e.g. ``("observation", "mission")``) to
                leave out of the data and the policy input.
            info_keys: the ``info`` entries to read (see :func:`splice.envs.infos.parse_info_keys`).

        Raises:
            ValueError: an excluded key matches no observation leaf, or every leaf is excluded.
        """
        self._set_obs_leaves(select_leaves(self._all_obs_leaves, list(exclude_keys or [])))
        self.infos = InfoReader(
            parse_info_keys(info_keys), num_envs=self.num_envs, batched=self.batched
        )
        self._update_fast_path()

    @property
    def info_leaves(self) -> list[Leaf]:
        """The info leaves stored per step (full batch keys); known after the first reset."""
        return self.infos.leaves

    @property
    def input_leaves(self) -> list[tuple[tuple[str, ...], Leaf]]:
        """``(batch key, leaf)`` of every value entering a step, in the order of :attr:`obs`:
        the observation leaves, then the info leaves (known after the first reset)."""
        return [(("observation", *leaf.key), leaf) for leaf in self.obs_leaves] + [
            (leaf.key, leaf) for leaf in self.infos.leaves
        ]

    # ------------------------------------------------------------------ staging
    def allocate(self, capacity: int) -> StepTargets:
        """Fresh staging arrays for ``capacity`` columns (pass the result to :meth:`bind`).
        Info leaves are included once known (after the first reset)."""
        b = self.num_envs

        def column(leaf: Leaf) -> np.ndarray:
            return np.empty((capacity, b, *leaf.shape), leaf.dtype)

        return StepTargets(
            next_obs=[column(leaf) for leaf in self.obs_leaves],
            reward=np.empty((capacity, b), np.float32),
            terminated=np.zeros((capacity, b), np.bool_),
            truncated=np.zeros((capacity, b), np.bool_),
            next_info=[column(leaf) for leaf in self.info_leaves],
        )

    def bind(self, staging: StepTargets) -> None:
        """Write subsequent steps into ``staging``."""
        self.staging = staging
        self._next_obs = staging.next_obs
        self._next_obs0 = staging.next_obs[0]
        self._next_info = staging.next_info
        self._next_info_ws = [item_writer(arr) for arr in staging.next_info]
        self._next_inputs = staging.next_obs + staging.next_info
        self._reward = staging.reward
        self._terminated = staging.terminated
        self._truncated = staging.truncated

    def _obs_values(self, obs: Any) -> list[Any]:
        """The observation leaves of ``obs``; a vector env's non-tensor leaves as object
        arrays ``[B]`` (gymnasium batches them as tuples)."""
        values = self._flatten(obs)
        if self._object_obs and self.batched:
            for i in self._object_obs:
                arr = np.empty(self.num_envs, OBJECT)
                arr[:] = list(values[i])
                values[i] = arr
        return values

    def _write_next_obs(self, obs: Any, c: int) -> list[Any]:
        """Write the observation returned by the env at column ``c``; return its leaves."""
        if self._single_leaf:
            self._next_obs0[c] = obs
            return [obs]
        values = self._obs_values(obs)
        for arr, value in zip(self._next_obs, values, strict=True):
            arr[c] = value
        return values

    def _read_info(self, info: Any, what: str) -> list[Any]:
        """The info leaves of ``info`` (discovering their layout at the first reset)."""
        if not self.infos.keys:
            return []
        if not self.infos.discovered:
            self.infos.discover(info)
        return self.infos.read(info, what)

    def _read_next_info(self, info: Any, c: int, check: bool) -> list[Any]:
        """Read the step's info leaves, write them at column ``c``; return them."""
        infos = self.infos
        values = None if check else infos.read_step(info)
        if values is None:
            values = infos.read(info, "step()", check)
        writers = self._next_info_ws
        try:  # one value per leaf (InfoReader.read)
            for i, (arr, value) in enumerate(zip(self._next_info, values)):  # noqa: B905
                writers[i] = write_item(writers[i], arr, c, value)
        except ValueError:
            infos.raise_bad_values(values, "step()")
        return values

    # --------------------------------------------------------------- validation
    def _check_obs(self, obs: Any, what: str) -> None:
        values = self._flatten(obs)
        lead = (self.num_envs,) if self.batched else ()
        for leaf, value in zip(self.obs_leaves, values, strict=True):
            if not leaf.is_tensor:
                if self.batched and len(value) != self.num_envs:
                    raise EnvError(
                        f"{what} returned {len(value)} values for the non-tensor observation "
                        f"{('observation', *leaf.key)!r}; expected {self.num_envs} (one per env)"
                    )
                continue
            shape = tuple(np.shape(value))
            if shape != (*lead, *leaf.shape):
                key = ("observation", *leaf.key)
                raise EnvError(
                    f"{what} returned observation {key!r} of shape {list(shape)}; expected "
                    f"{list((*lead, *leaf.shape))} from the observation space "
                    f"{self.single_observation_space!r}"
                    + (f" for {self.num_envs} envs" if self.batched else "")
                )

    def _check_step(self, obs: Any, reward: Any, terminated: Any, truncated: Any) -> None:
        self._check_obs(obs, "step()")
        lead = (self.num_envs,) if self.batched else ()
        for name, value in (
            ("reward", reward),
            ("terminated", terminated),
            ("truncated", truncated),
        ):
            shape = tuple(np.shape(value))
            if shape != lead:
                raise EnvError(
                    f"step() returned {name} of shape {list(shape)}; expected {list(lead)}"
                    + (f" (one per env, {self.num_envs} envs)" if self.batched else " (a scalar)")
                )
            if name != "reward" and np.asarray(value).dtype.kind not in "bui":
                raise EnvError(
                    f"step() returned {name} of dtype {np.asarray(value).dtype}; expected bool"
                )
        self.check_next = False

    # ------------------------------------------------------------------ the API
    @abstractmethod
    def reset(self, seed: int | None = None) -> None:
        """Reset every env (seeded when ``seed`` is given) and set :attr:`obs`."""

    @abstractmethod
    def step(self, action: Any, c: int) -> np.ndarray | None:
        """Apply ``action`` to every env and write the results at column ``c``.

        Returns:
            ``None``, or the mask of envs that restart (see the module docstring).
        """

    def step_function(self) -> Callable[[Any, int], np.ndarray | None]:
        """What the collector loop calls for each step: :meth:`step`, or an equivalent callable
        an adapter makes cheaper to call (valid until the next :meth:`bind` or :meth:`select`).

        Examples:
            >>> import gymnasium as gym
            >>> from splice.envs import make_adapter
            >>> adapter = make_adapter(gym.make("CartPole-v1"))
            >>> adapter.bind(adapter.allocate(capacity=4))
            >>> adapter.reset(seed=0)
            >>> step = adapter.step_function()  # called as ``adapter.step(action, c)``
            >>> step(1, 0) is None, adapter.staging.reward[0]
            (True, array([1.], dtype=float32))
            >>> adapter.close()
        """
        return self.step

    @abstractmethod
    def reset_envs(self, mask: np.ndarray) -> None:
        """Reset the envs where ``mask`` is True (the env did not end them); update :attr:`obs`."""

    def incomplete(self) -> np.ndarray | None:
        """Per row, the staging column of its oldest step whose results :meth:`step` has not
        written yet (``-1`` where none), or ``None`` when every step's results are written at
        its own column (the default). An adapter whose step's results come later (a
        turn-based agent's next observation arrives at its next turn) writes them into that
        column then; the loop keeps stepping until no batch it returns holds such a step."""
        return None

    def columns_moved(self, shift: int) -> None:
        """Staging moved its columns ``shift`` places to the front (what was column ``c`` is
        now ``c - shift``): an adapter that remembers columns (see :meth:`incomplete`)
        updates them. The default remembers none."""
        return None

    def wrap_policy(self, policy: Any) -> Any:
        """The policy the loop runs for this adapter's rows, made from the user's
        (already in the policy protocol, :func:`splice.policies.as_policy`). The default is
        the policy itself; an adapter whose rows are not all stepped each step (agent slots)
        wraps it so that it sees only the rows it acts for.

        Examples:
            >>> from splice.envs import make_adapter
            >>> adapter = make_adapter("CartPole-v1")
            >>> policy = lambda td: td
            >>> adapter.wrap_policy(policy) is policy
            True
            >>> adapter.close()
        """
        return policy

    def action_sampler(self) -> Any:
        """A callable drawing uniform random actions for all envs from
        :attr:`random_action_space` (a bare callable: one call level less in the hot loop)."""
        return self.random_action_space.sample

    def seed_actions(self, seed: int | None) -> None:
        """Seed the random actions of :meth:`action_sampler`."""
        self.random_action_space.seed(seed)

    def detach_obs(self) -> None:
        """Make :attr:`obs` independent of the staging arrays (they are about to be reused)."""
        self.obs = [np.array(x) if isinstance(x, np.ndarray) else x for x in self.obs]

    def env_action(self, action: np.ndarray) -> Any:
        """Turn a policy's action array into what ``env.step`` takes."""
        return action

    def close(self) -> None:
        """Close the wrapped environment."""
        self.env.close()
