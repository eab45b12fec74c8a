"""``python -m w4a16_moe [demo|doctor|bench|bench-ep|tune|profile|aot] ...`` (``demo`` when no command is given)."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv.pop(0) if argv and not argv[0].startswith("-") else "demo"
    if cmd == "demo":
        from .demo import main as run
    elif cmd == "doctor":
        from .doctor import main as run
    elif cmd == "bench":
        from .bench.run import main as run
    elif cmd == "bench-ep":
        from .bench.ep import main as run
    elif cmd == "tune":
        from .bench.tune import main as run
    elif cmd == "profile":
        from .bench.profile import main as run
    elif cmd == "aot":
        from .aot import main as run
    else:
        print(f"unknown command {cmd!r}; commands: demo, doctor, bench, bench-ep, tune, profile, aot", file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
