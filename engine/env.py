"""Boolean environment variables: the one reading of a switch such as APPLIANCE_PDL=0.

The engine's switches (APPLIANCE_PDL, APPLIANCE_CPU_ONEDNN, TRITON_INTERPRET) and the
appliance's APPLIANCE_<SETTING> booleans read the same words. This module imports only the
standard library, so kernels (leaves) and the appliance both use it without importing anything
else of the engine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TRUE_WORDS = ("1", "true", "yes", "on", "t", "y")
"""Values that switch on, in any case (the first four are the documented ones)."""
FALSE_WORDS = ("0", "false", "no", "off", "f", "n")
"""Values that switch off, in any case."""
FLAG_WORDS = "1/0, true/false, yes/no or on/off"
"""What a switch accepts, in words for error messages and help."""


def parse_flag(text: str, where: str) -> bool:
    """The switch `text` stands for (surrounding spaces and case ignored). Raises ValueError
    naming `where` (the variable) and the accepted words for anything else."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{where}={text!r} is not a boolean: use {FLAG_WORDS}")


def env_flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Environment variable `name` (in `environ`, default os.environ) as a switch; `default`
    where it is unset or empty. Raises ValueError for a value that is not a switch."""
    text = (os.environ if environ is None else environ).get(name, "")
    return parse_flag(text, name) if text.strip() else default
