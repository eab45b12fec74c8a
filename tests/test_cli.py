"""The command line on the CPU: ``--help`` lists every command, each command's help is plain text, the demo's
CPU output explains its NRMSE column and checks every row, and importing the package raises no warning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from w4a16_moe import __main__ as cli_main
from w4a16_moe import cli, demo

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, **env):
    e = dict(os.environ, PYTHONPATH=str(ROOT / "python"), **env)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=e, timeout=300)


def test_help_lists_every_command():
    r = _run("-m", "w4a16_moe", "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    listed = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("  ") and ln.split()]
    assert listed == list(cli_main.COMMANDS)
    assert "demo" in r.stdout and "--schemes" not in r.stdout  # the command list, not the demo's options


def test_unknown_command_lists_the_commands(capsys):
    assert cli_main.main(["nonsense"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nonsense'" in err and all(c in err for c in cli_main.COMMANDS)


@pytest.mark.parametrize("command", list(cli_main.COMMANDS))
def test_command_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main.main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m w4a16_moe {command}")
    assert "``" not in out and ":func:" not in out and ":data:" not in out


def test_plain_strips_rst():
    assert cli.plain("run ``fused_moe`` via :func:`w4a16_moe.api.fused_moe` or :data:`~a.B`") == (
        "run fused_moe via w4a16_moe.api.fused_moe or a.B")


def test_demo_on_cpu_explains_nrmse_and_checks_rows(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert demo.main(["--schemes", "int4_g32"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU" in out and "quantization error" in out and "original BF16 weights" in out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("int4_g32 ")]
    assert len(rows) == 1 and rows[0][-1] == "ok"
    monkeypatch.setattr(demo, "CPU_NRMSE_LIMIT", 0.0)  # every row over the limit
    assert demo.main(["--schemes", "int4_g32"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAIL")


def test_import_raises_no_warning():
    r = _run("-W", "error", "-c", "import w4a16_moe")
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr[-3000:]


def _readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


def test_readme_example_runs_on_cpu(monkeypatch):
    code = _readme_block("Example")
    shapes = "E, H, I, top_k, T = 32, 2048, 768, 8, 16"
    assert shapes in code, "the README example's shape line changed: update this test"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    scope: dict = {}
    exec(compile(code.replace(shapes, "E, H, I, top_k, T = 8, 256, 128, 2, 4"), "README.md", "exec"), scope)
    assert scope["backend"] == "reference" and scope["y"].shape == (4, 256) and scope["nrmse"] < 0.02


def test_readme_commands_exist():
    text = (ROOT / "README.md").read_text()
    used = set(re.findall(r"python -m w4a16_moe ([a-z][a-z-]*)", text))
    assert used and used <= set(cli_main.COMMANDS), used - set(cli_main.COMMANDS)
