"""Shared plumbing of the ``python -m w4a16_moe`` commands: plain-text help built from module docstrings.

Every command builds its parser with :func:`parser`, so ``--help`` shows the command module's docstring
as plain text: RST markup (double backticks, ``:func:`` roles) is stripped from the description and from
every argument's help string by one function, :func:`plain`.
"""

from __future__ import annotations

import argparse
import re

__all__ = ["parser", "plain"]

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :func:`x`, :data:`~a.b` -> x, a.b


def plain(text: str) -> str:
    """``text`` without RST inline markup: ``code`` -> code, :func:`name` -> name."""
    return _ROLE.sub(r"\1", text or "").replace("``", "")


class _PlainFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the docstring's line breaks and strips RST markup from the description and argument help."""

    def _format_text(self, text):
        return super()._format_text(plain(text))

    def _expand_help(self, action):
        return plain(super()._expand_help(action))


def parser(command: str, doc: str, **kwargs) -> argparse.ArgumentParser:
    """The argument parser of ``python -m w4a16_moe <command>``, described by ``doc`` (a module docstring)."""
    return argparse.ArgumentParser(prog=f"python -m w4a16_moe {command}", description=(doc or "").strip(),
                                   formatter_class=_PlainFormatter, **kwargs)
