"""Compile many kernels at once: :func:`compile_jobs` spreads ``(spec, arch, out_dir)`` jobs over a pool of
spawned processes (each imports the CuTe DSL once) and reports progress; every job is
:func:`.build.compile_one`, so the objects are the same as compiling them one by one."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from ._log import LOGGER_NAME
from .build import compile_one
from .spec import KernelSpec, get_family, register_family

__all__ = ["compile_jobs", "compile_objects_parallel"]


def _family_ref(family: str) -> tuple:
    info = get_family(family)
    fn = info.compile_fn
    ref = fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}"
    return family, ref, tuple(info.sources)


def compile_objects_parallel(specs: Sequence[KernelSpec], arch: str, out_dir, workers: Optional[int] = None) -> list:
    """Like :func:`.build.compile_objects`, spread over ``workers`` spawned processes (see :func:`compile_jobs`).
    Returns ``.o`` paths in the order of ``specs``."""
    return compile_jobs([(s, arch, Path(out_dir)) for s in specs], workers)


def compile_jobs(jobs: Sequence, workers: Optional[int] = None, on_done=None, chunk: Optional[int] = None) -> list:
    """Compile ``jobs`` = ``[(spec, arch, out_dir), ...]`` in a pool of ``workers`` spawned processes (each
    imports the DSL once, ~1 s, and then takes chunks of ``chunk`` jobs); ``on_done(n_done, n_total,
    record)`` is called in this process after every finished job (progress display). Families registered
    with a callable must be importable as ``module:qualname`` in the workers. Returns the ``.o`` paths in
    the order of ``jobs``; the first failure raises :class:`.toolchain.BuildError` after the pool is shut down."""
    jobs = [(s, a, Path(d)) for s, a, d in jobs]
    if not jobs:
        return []
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    out = []
    if workers == 1:
        for i, (s, a, d) in enumerate(jobs):
            rec = compile_one(s, a, d)
            out.append(d / rec["object"])
            if on_done:
                on_done(i + 1, len(jobs), rec)
        return out
    from concurrent.futures import FIRST_COMPLETED, wait

    chunk = chunk or max(1, min(8, len(jobs) // (workers * 4)))
    parts = [jobs[i : i + chunk] for i in range(0, len(jobs), chunk)]
    fams = [_family_ref(f) for f in sorted({s.family for s, _, _ in jobs})]
    lvl = logging.getLogger(LOGGER_NAME).getEffectiveLevel()
    done = 0
    with _executor(workers) as ex:
        futs = {ex.submit(_compile_worker_jobs, [(s.to_json(), a, str(d)) for s, a, d in p], fams, lvl) for p in parts}
        pending = set(futs)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                if f.exception() is not None:
                    for p in pending:
                        p.cancel()
                    raise f.exception()
                for rec in f.result():
                    done += 1
                    if on_done:
                        on_done(done, len(jobs), rec)
    return [d / f"{s.name}.o" for s, _, d in jobs]


def _executor(workers: int):
    """The pool of ``workers`` spawned processes, each bound to this process's life (:func:`_bind_to_parent`)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                               initializer=_bind_to_parent, initargs=(os.getpid(),))


def _bind_to_parent(parent_pid: int) -> None:
    """Pool initializer: on Linux the worker gets SIGTERM when the process that started it dies, so a build killed
    by SIGTERM / SIGKILL (a CI timeout, ``kill``) leaves no worker compiling on; a worker whose parent is already
    gone exits at once."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no prctl in this libc: only the check below
            pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _compile_worker_jobs(jobs: list, families: list, log_level: int) -> list:
    logging.getLogger(LOGGER_NAME).setLevel(log_level)
    for fam, ref, srcs in families:
        register_family(fam, ref, sources=srcs, replace=True)
    return [compile_one(KernelSpec.from_json(sj), arch, Path(d)) for sj, arch, d in jobs]

