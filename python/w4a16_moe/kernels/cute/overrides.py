"""Explicit selection overrides of the CuTe provider, for the tuner, the profiler and the GPU tests.

:func:`forced` makes every SM90 call take one candidate tile shape (and split-K); :func:`forced_decode` makes
every routed call that fits one launch run the route-major decode kernels with given knobs. Both are context
managers over one immutable :class:`Overrides` value that plan caching keys on (:func:`current`); nothing else
in the call path reads test-only state.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Union

__all__ = ["Overrides", "current", "forced", "forced_decode"]


@dataclass(frozen=True)
class Overrides:
    """``candidate``: an SM90 candidate (name, or position in ``CANDIDATES``) every SM90 call takes, with
    ``splits`` split-K parts (None: the ``num_splits`` rule); ``decode_knobs``: the decode kernels' knob
    items (``decode.family.knob_items``) every routed call that fits one launch runs with (``()``: none)."""

    candidate: Optional[Union[str, int]] = None
    splits: Optional[int] = None
    decode_knobs: Optional[tuple] = None

    @property
    def any(self) -> bool:
        return self.candidate is not None or self.decode_knobs is not None


_NONE = Overrides()
_current = _NONE
_lock = threading.Lock()


def current() -> Overrides:
    return _current


@contextlib.contextmanager
def _set(value: Overrides) -> Iterator[Overrides]:
    global _current
    with _lock:
        saved, _current = _current, value
    try:
        yield value
    finally:
        with _lock:
            _current = saved


def forced(bucket: Optional[Union[str, int]], splits: Optional[int] = None):
    """Within the block every SM90 call takes candidate ``bucket`` (its name, or its index into
    ``sm90.family.CANDIDATES``) with ``splits`` split-K parts (None: the ``num_splits`` rule), and no call
    runs the decode kernels; ``bucket`` None forces nothing."""
    if bucket is None:
        return _set(_current)
    return _set(replace(_NONE, candidate=bucket, splits=splits))


def forced_decode(knobs: dict):
    """Within the block every routed SM90 call that fits one launch runs the decode kernels with ``knobs``
    (``{"gate_up": {...}, "down": {...}}``, see ``decode.family.parse_knobs``)."""
    items = tuple((m, tuple(sorted(v.items()))) for m, v in sorted(knobs.items()))
    return _set(replace(_NONE, decode_knobs=items))
