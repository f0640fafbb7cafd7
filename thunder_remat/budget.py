"""Reading ``remat_memory_budget``: a fraction of the way from the smallest to the fastest plan, or bytes.

* a float in [0, 1] (``0.5``) or a percentage string (``"50%"``): 1.0 is the fastest plan (the
  minimum cut with every policy applied), 0.0 the plan that saves the fewest bytes;
* an int of bytes (``2_000_000``) or a string with a unit (``"2GiB"``, ``"512MB"``, ``"100000B"``);
* a step peak, ``"peak:6GiB"``: the most bytes the training step may hold at once above what is
  allocated when it starts (parameters, inputs), as thunder_remat estimates it.

The ints 0 and 1 are refused as ambiguous (write 0.0 / 1.0 for fractions, "0B" / "1B" for bytes).
"""

from __future__ import annotations

import enum
import math
import re
from typing import NamedTuple

__all__ = ["BudgetKind", "Budget", "parse_budget", "BUDGET_HELP"]


class BudgetKind(str, enum.Enum):
    """What a budget's amount counts (a ``str`` enum: ``("fraction", 0.5)`` reads the same)."""

    #: of the way from the smallest plan (0.0) to the fastest (1.0)
    FRACTION = "fraction"
    #: bytes of saved activations
    BYTES = "bytes"
    #: bytes of the step's estimated peak (saved, recomputed and backward values, gradients)
    PEAK = "peak"

    def __str__(self) -> str:
        return self.value


class Budget(NamedTuple):
    kind: BudgetKind
    amount: float

    @classmethod
    def fraction(cls, amount: float) -> Budget:
        return cls(BudgetKind.FRACTION, float(amount))

    @classmethod
    def bytes(cls, amount: float) -> Budget:
        return cls(BudgetKind.BYTES, float(amount))

    @classmethod
    def peak(cls, amount: float) -> Budget:
        return cls(BudgetKind.PEAK, float(amount))


BUDGET_HELP = (
    "a fraction in [0, 1] (e.g. 0.5 or '50%'), a number of bytes as an int >= 2, "
    "a size string such as '2GiB', '512MB', '100000B', or a step peak such as 'peak:6GiB'"
)
_PEAK_PREFIX = "peak:"

_UNITS = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]+)\s*$")
_PERCENT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")


def _bad(value, why: str = "") -> ValueError:
    extra = f" ({why})" if why else ""
    return ValueError(f"thunder_remat option 'remat_memory_budget' must be {BUDGET_HELP}; got {value!r}{extra}")


def parse_budget(value) -> Budget | None:
    """``None`` (no budget), ``Budget.fraction(f)`` or ``Budget.bytes(n)``; a ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _bad(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise _bad(value, "a float is a fraction and must lie in [0, 1]")
        return Budget.fraction(value)
    if isinstance(value, int):
        if value in (0, 1):
            raise _bad(value, "ambiguous: write 0.0/1.0 for a fraction or '0B'/'1B' for bytes")
        if value < 0:
            raise _bad(value, "bytes cannot be negative")
        return Budget.bytes(value)
    if isinstance(value, str) and value.strip().lower().startswith(_PEAK_PREFIX):
        size = value.strip()[len(_PEAK_PREFIX):]
        m = _SIZE.match(size)
        if not (m and m.group(2).upper() in _UNITS):
            raise _bad(value, "a peak is a size with a unit, e.g. 'peak:6GiB' or 'peak:500000B'")
        return Budget.peak(math.floor(float(m.group(1)) * _UNITS[m.group(2).upper()]))
    if isinstance(value, str):
        m = _PERCENT.match(value)
        if m:
            f = float(m.group(1)) / 100.0
            if not 0.0 <= f <= 1.0:
                raise _bad(value, "a percentage must lie in [0%, 100%]")
            return Budget.fraction(f)
        m = _SIZE.match(value)
        if m and m.group(2).upper() in _UNITS:
            return Budget.bytes(math.floor(float(m.group(1)) * _UNITS[m.group(2).upper()]))
        if value.strip().isdigit():
            return parse_budget(int(value.strip()))
        raise _bad(value)
    raise _bad(value)
