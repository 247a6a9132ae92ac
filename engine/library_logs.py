"""Third-party libraries' own log messages: quiet on a plain run, where we import the library;
shown under a verbose flag (`appliance eval-quant --verbose`, `appliance serve --log-level
debug`). A library whose logger level someone set by hand is left as it is."""

from __future__ import annotations

import logging

LIBRARIES = ("bitsandbytes",)
"""The libraries we quiet: bitsandbytes logs a warning about optional kernels it could not fetch
(kernels-community) on every CPU import, which says nothing about our results."""


def quiet(name: str) -> None:
    """Show only errors from library `name`'s logs, unless this process logs at DEBUG or the
    library's level was set by hand (show() does that)."""
    logger = logging.getLogger(name)
    if logger.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        logger.setLevel(logging.ERROR)


def show() -> None:
    """The verbose flag: the libraries' warnings reach the log as they would without us."""
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
