"""The package logger ``w4a16_moe``; ``W4A16_MOE_LOG=debug|info|warning`` sets its level."""

from __future__ import annotations

import logging

__all__ = ["logger"]

logger = logging.getLogger("w4a16_moe")


def _configure() -> None:
    from . import settings

    level = settings.get().log.upper()
    if not level:
        return
    logger.setLevel(getattr(logging, level, logging.INFO))
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[w4a16_moe %(levelname)s] %(message)s"))
        logger.addHandler(handler)


_configure()
