"""The error an environment adapter raises when an env breaks its own declared contract."""

from __future__ import annotations

__all__ = ["EnvError"]


class EnvError(ValueError):
    """An environment returned something that does not match its declared spaces (or a
    requested info entry is missing or malformed): the message names the key."""
