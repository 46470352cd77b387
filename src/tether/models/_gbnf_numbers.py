"""GBNF for JSON numbers inside a range (JSON Schema minimum/maximum and their exclusive forms).

Integers in [lo, hi] are written digit by digit (the classic range-to-regex split), so every
accepted integer is in range and no integer in range is left out. Numbers with a fraction are
sound, not complete: `i.f` is offered only when every `i.f` lies in the range (i in [lo, hi-1]
for i >= 0, mirrored for negatives); exponents are never offered under a bound.
"""

from __future__ import annotations

import math

from tether._errors import InvalidInput


def _same_length(lo: str, hi: str) -> list[str]:
    """Sequences matching the decimal strings from lo to hi, both of the same length."""
    if len(lo) == 1:
        return [f"[{lo}-{hi}]" if lo != hi else f'"{lo}"']
    if lo[0] == hi[0]:
        return [f'"{lo[0]}" {rest}' for rest in _same_length(lo[1:], hi[1:])]
    n = len(lo) - 1
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return [f"[{lo[0]}-{hi[0]}] [0-9]{{{n}}}"]
    out = [f'"{lo[0]}" {rest}' for rest in _same_length(lo[1:], "9" * n)]
    a, b = int(lo[0]) + 1, int(hi[0]) - 1
    if a <= b:
        out.append(f"[{a}-{b}] [0-9]{{{n}}}")
    out += [f'"{hi[0]}" {rest}' for rest in _same_length("0" * n, hi[1:])]
    return out


def natural_range(lo: int, hi: int) -> list[str]:
    """Alternatives matching exactly the integers lo..hi (0 <= lo <= hi) without leading zeros."""
    out: list[str] = []
    while lo <= hi:
        top = min(hi, 10 ** len(str(lo)) - 1)
        out += _same_length(str(lo), str(top))
        lo = top + 1
    return out


def integer_range(lo: int, hi: int) -> str:
    """GBNF matching exactly the JSON integers lo..hi."""
    if lo > hi:
        raise InvalidInput(f"empty integer range {lo}..{hi}")
    parts = []
    if hi >= 0:
        parts += natural_range(max(lo, 0), hi)
    if lo < 0:
        parts += [f'"-" {p}' for p in natural_range(max(1, -hi), -lo)]
    return " | ".join(f"({p})" for p in parts)


def bounds(node: dict, *, integer: bool, digits: int) -> tuple[int | float, int | float]:
    """(lo, hi) from minimum/maximum/exclusive*, clamped to what `digits` digits can write."""
    lo: float = -math.inf
    hi: float = math.inf
    if isinstance(node.get("minimum"), int | float) and not isinstance(node.get("minimum"), bool):
        lo = max(lo, node["minimum"])
    if isinstance(node.get("maximum"), int | float) and not isinstance(node.get("maximum"), bool):
        hi = min(hi, node["maximum"])
    ex_lo, ex_hi = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    cap = 10**digits - 1
    if integer:
        ilo = -cap if lo == -math.inf else math.ceil(lo)
        ihi = cap if hi == math.inf else math.floor(hi)
        if isinstance(ex_lo, int | float) and not isinstance(ex_lo, bool):
            ilo = max(ilo, math.floor(ex_lo) + 1)
        if isinstance(ex_hi, int | float) and not isinstance(ex_hi, bool):
            ihi = min(ihi, math.ceil(ex_hi) - 1)
        return max(ilo, -cap), min(ihi, cap)
    if isinstance(ex_lo, int | float) and not isinstance(ex_lo, bool):
        lo = max(lo, ex_lo)
    if isinstance(ex_hi, int | float) and not isinstance(ex_hi, bool):
        hi = min(hi, ex_hi)
    return lo, hi


def has_bounds(node: dict) -> bool:
    return any(k in node for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))


def number_range(node: dict, *, digits: int, fraction_digits: int) -> str | None:
    """GBNF for JSON numbers within the node's bounds, or None when no number fits.

    Integers: every integer strictly inside an exclusive bound, or on an inclusive one. With a
    fraction `.d+`: i >= 0 is offered when i >= lo and i + 1 <= hi (strict for exclusive
    bounds, since i.f > i and i.f < i + 1), mirrored for negatives.
    """
    lo, hi = bounds(node, integer=False, digits=digits)
    cap = 10**digits - 1
    ex_lo = "exclusiveMinimum" in node and lo == node["exclusiveMinimum"]
    ex_hi = "exclusiveMaximum" in node and hi == node["exclusiveMaximum"]
    # whole numbers
    ilo = -cap if lo == -math.inf else (math.floor(lo) + 1 if ex_lo and float(lo).is_integer() else math.ceil(lo))
    ihi = cap if hi == math.inf else (math.ceil(hi) - 1 if ex_hi and float(hi).is_integer() else math.floor(hi))
    ilo, ihi = max(ilo, -cap), min(ihi, cap)
    parts = []
    if ilo <= ihi:
        parts.append(f"({integer_range(ilo, ihi)})")
    frac = f'"." [0-9]{{1,{fraction_digits}}}'
    # i.f with i >= 0 lies in [i, i+1) ("i.0" is i itself): needs i >= lo (i > lo when exclusive)
    # and i + 1 <= hi.
    plo = max(0, math.floor(lo) + 1 if ex_lo else math.ceil(lo)) if lo != -math.inf else 0
    phi = min(cap, math.floor(hi) - 1) if hi != math.inf else cap
    if plo <= phi:
        parts.append(f"(({integer_range(plo, phi)}) {frac})")
    # -(m.f) with m >= 0 lies in (-(m+1), -m]: needs -m <= hi (-m < hi when exclusive) and -(m+1) >= lo.
    mlo = max(0, math.floor(-hi) + 1 if ex_hi else math.ceil(-hi)) if hi != math.inf else 0
    mhi = min(cap, math.floor(-lo) - 1) if lo != -math.inf else cap
    if mlo <= mhi:
        parts.append(f'("-" ({integer_range(mlo, mhi)}) {frac})')
    return " | ".join(parts) if parts else None
