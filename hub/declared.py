"""What decorators declare about a view, kept in a table beside the view rather than on it.

A table holds one frozen dataclass per view function (``default`` for a view that declares nothing).
Decorators such as ``validation.body`` wrap a view (``functools.wraps``), and a route is registered
with the outermost wrapper: a lookup follows ``__wrapped__`` to the declaration, and a declaration
made on a wrapper starts from the one inside. Used for what a route asks of its caller
(hub/auth/routes.py) and for what the OpenAPI document says of its path and body (hub/api/validation.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Declared(Generic[T]):
    def __init__(self, default: T) -> None:
        self.default = default
        self._of: dict[Callable, T] = {}

    def of(self, view: Callable | None) -> T:
        """The view's declaration; a view seen once is a dict lookup after (views live as long as the app)."""
        if view is None:
            return self.default
        found = self._of.get(view)
        if found is None:
            inner: Any = getattr(view, "__wrapped__", None)
            found = self.of(inner) if inner is not None else self.default
            self._of[view] = found
        return found

    def declare(self, view: Callable, **changes: Any) -> Callable:
        """Set ``changes`` (fields of the declaration) over what ``view`` and the views it wraps declare."""
        self._of[view] = dataclasses.replace(self.of(view), **changes)  # type: ignore[type-var]
        return view
