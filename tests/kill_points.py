"""A kill at a chosen point of a run, for the resume tests (imported by test modules; tests/ is on the path)."""

from __future__ import annotations


class Killed(BaseException):
    """A kill, as it were: nothing in the run catches it (a ``BaseException``, not an ``Exception``)."""


def kill_at(monkeypatch, module, name: str, call: int) -> None:
    """Make ``module.name`` raise :class:`Killed` on its ``call``-th call (1-based) from now on."""
    real, calls = getattr(module, name), [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
