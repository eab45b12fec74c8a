"""``python -m w4a16_moe [command] ...``: the package's commands (the demo when no command is given).

``python -m w4a16_moe --help`` lists them; ``python -m w4a16_moe <command> --help`` describes one.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line summary); the module's ``main(argv) -> int`` runs the command
COMMANDS = {
    "demo": ("w4a16_moe.demo", "quantize a built-in MoE layer with every scheme, run it, check it (the default)"),
    "doctor": ("w4a16_moe.doctor", "what this machine can run, and which provider and kernels a case gets"),
    "bench": ("w4a16_moe.bench.run", "the W1/W2 benchmark on a GPU (docs/benchmarks.md): timing, floor, NRMSE"),
    "bench-ep": ("w4a16_moe.bench.ep", "an expert-parallel layer on two GPUs (NCCL) against one GPU"),
    "tune": ("w4a16_moe.bench.tune", "time every candidate tile shape / split-K per token count (tuned table)"),
    "profile": ("w4a16_moe.bench.profile", "per-kernel time of one MoE call under torch.profiler"),
    "aot": ("w4a16_moe.aot", "cross-compile the CuTe kernels for given archs into prebuilt libraries"),
}


def usage() -> str:
    """The top-level help: every command with its one-line summary."""
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m w4a16_moe [command] [args ...]   (or: w4a16-moe [command] [args ...])", "",
             "Fused MoE kernels with 4-bit weights and 16-bit activations. Commands:", ""]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "With no command (or only options) it runs the demo. "
              "'python -m w4a16_moe <command> --help' describes a command."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    cmd = argv.pop(0) if argv and not argv[0].startswith("-") else "demo"
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return importlib.import_module(COMMANDS[cmd][0]).main(argv)


if __name__ == "__main__":
    sys.exit(main())
