"""The stand-in check's agreement with the whole model (tests/conftest.py, tests/fast/test_stand_in.py)."""

from __future__ import annotations

from autocast_onnx.errors import AutocastError, InternalCheckError

# (stand-in bytes, whole bytes, verdict) of each comparison made in this process
COMPARED: list[tuple[int, int, str | None]] = []


def verdict(check, data: bytes) -> str | None:
    """None when `check` passes `data`, else the kind of its failure."""
    try:
        check(data)
    except (InternalCheckError, AutocastError) as exc:
        return type(exc).__name__
    return None


def checked_both_ways(check, whole, stand_in: bytes) -> None:
    """Run the checker on the stand-in and on the whole bytes; fail unless both pass or both fail."""
    whole_bytes = bytes(whole)
    on_stand_in, on_whole = verdict(check, stand_in), verdict(check, whole_bytes)
    assert on_stand_in == on_whole, f"the stand-in's verdict {on_stand_in} differs from the whole model's {on_whole}"
    COMPARED.append((len(stand_in), len(whole_bytes), on_whole))
