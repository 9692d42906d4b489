"""Functions chosen by name from the config (the style of verl's ``register_adv_est``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Registry(dict[str, F]):
    """Name -> function, filled by the ``register`` decorator where each function is defined.

    >>> squares: Registry[Callable[[int], int]] = Registry("square")
    >>> @squares.register("plain")
    ... def plain(x: int) -> int:
    ...     return x * x
    >>> squares.lookup("plain")(3)
    9
    >>> squares.lookup("cubed")
    Traceback (most recent call last):
    ...
    ValueError: unknown square 'cubed'; have plain
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: file ``fn`` under ``name`` (a second function of that name is an error)."""

        def deco(fn: F) -> F:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self[name] = fn
            return fn

        return deco

    def lookup(self, name: str) -> F:
        """The function registered as ``name``; the error lists every name there is."""
        try:
            return self[name]
        except KeyError:
            have = ", ".join(sorted(self))
            raise ValueError(f"unknown {self.kind} {name!r}; have {have}") from None
