"""Explicit selection overrides of the CuTe provider, for the tuner, the profiler and the GPU tests.

:func:`forced` makes every SM90 call take one candidate tile shape (and split-K); :func:`forced_decode` makes
every routed call that fits one launch run the route-major decode kernels with given knobs; :func:`forced_loop_grid`
makes the warp-MMA grouped GEMMs run tile-loop kernels on a given grid. All are context managers over one
immutable :class:`Overrides` value that plan caching keys on (:func:`current`); nothing else in the call path
reads test-only state.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Union

__all__ = ["Overrides", "current", "forced", "forced_decode", "forced_loop_grid"]


@dataclass(frozen=True)
class Overrides:
    """``candidate``: an SM90 candidate (name, or position in ``CANDIDATES``) every SM90 call takes, with
    ``splits`` split-K parts (None: the ``num_splits`` rule); ``loop_grid``: grid y of every warp-MMA plan, which
    then runs tile-loop kernels (None: :func:`~.tiles.loop_grid` where the setting asks for them);
    ``decode_knobs``: the decode kernels' knob items (``decode.family.knob_items``) every routed call that fits one
    launch runs with (``()``: none)."""

    candidate: Optional[Union[str, int]] = None
    splits: Optional[int] = None
    loop_grid: Optional[int] = None
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


def forced_loop_grid(grid: int):
    """Within the block every grouped-GEMM plan of the warp-MMA family runs tile-loop kernels with grid y ``grid``
    (at most the tile bound), on top of the current overrides: what the GPU tests shrink to make CTAs loop over
    several tiles."""
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"loop_grid must be >= 1, got {grid}")
    return _set(replace(_current, loop_grid=grid))
