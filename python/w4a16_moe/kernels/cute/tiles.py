"""Host-side tile rules shared by the grouped-GEMM families (no DSL import): the routes-per-expert bucket of a
call, and the ``group`` codegen parameter of a scheme.

A family's tile table is a tuple of ``(bound, tiles)``: the first entry whose ``bound`` (routes per expert) is at
least the call's, or whose bound is None, gives the call's tile parameters.
"""

from __future__ import annotations

__all__ = ["routes_per_expert", "select", "group_param"]


def routes_per_expert(num_routes: int, num_experts: int) -> int:
    """``cdiv(T * k, min(E, T * k))``: an upper bound on the routes of one active expert (under expert
    parallelism most routes may belong to other ranks; only host-known sizes are used)."""
    return -(-num_routes // max(1, min(num_experts, num_routes)))


def select(table: tuple, num_routes: int, num_experts: int) -> dict:
    """The tile parameters of ``table`` for a call of ``num_routes = T * k`` routes over ``num_experts``."""
    r = routes_per_expert(num_routes, num_experts)
    for bound, tiles in table:
        if bound is None or r <= bound:
            return dict(tiles)
    raise ValueError("tile table: the last entry's bound must be None")


def group_param(scheme) -> int:
    """The ``group`` config field of a scheme: its group size, 0 for per-channel scales."""
    return 0 if scheme.group_size is None else scheme.group_size
