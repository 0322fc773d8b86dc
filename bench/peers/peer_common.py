"""Helpers the PyTorch peer scripts share (they run as `python3 bench/peers/<script>.py`, so this
folder is on their import path)."""


def percentile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default; ditto's stats.h too)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def short_error(exc):
    """The first line of an exception, with its type, at most 400 characters."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:400]
