"""The package logger ``"w4a16_moe"``; its level comes from ``W4A16_MOE_LOG`` (``debug``, ``info``, ``warning``...)."""

from __future__ import annotations

import logging

LOGGER_NAME = "w4a16_moe"
_configured = False


def get_logger() -> logging.Logger:
    """Return the package logger, applying ``W4A16_MOE_LOG`` once (adds a stderr handler if none exists)."""
    global _configured
    log = logging.getLogger(LOGGER_NAME)
    if not _configured:
        try:  # the package-wide configuration, where present, is the one place that applies W4A16_MOE_LOG
            from .. import log as _pkg_log  # noqa: F401

            _configured = True
        except Exception:
            pass
    if not _configured:
        _configured = True
        from .. import settings

        level = settings.get().log
        if level:
            lv = int(level) if level.isdigit() else logging.getLevelName(level.upper())
            if isinstance(lv, int):
                log.setLevel(lv)
                if not log.handlers:
                    h = logging.StreamHandler()
                    h.setFormatter(logging.Formatter("[w4a16_moe %(levelname)s] %(message)s"))
                    log.addHandler(h)
    return log
