"""The one form of HTTP Range the cache serves, parsed strictly. Pure.

Pullers ask for one byte range at a time, so exactly one ``bytes=first-last``, ``bytes=first-``
or ``bytes=-suffix`` range is accepted; several ranges (overlapping or not), inverted ranges,
ranges starting past the end, other units, signs, spaces, non-ASCII digits or absurdly long
numbers are refused (416 when the form is right but the bytes are not there, 400 otherwise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# [0-9], not \d: \d would take other scripts' digits ("bytes=\u0660-9"), which int() reads but
# aiohttp's FileResponse (ASCII only) does not, so it would answer the range on its own terms.
_RANGE = re.compile(r"bytes=([0-9]{0,19})-([0-9]{0,19})")


@dataclass(frozen=True, slots=True)
class ByteRange:
    start: int
    end: int  # exclusive

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class RangeRefused:
    status: int  # 400 or 416
    reason: str


def parse_range(header: str | None, size: int) -> ByteRange | RangeRefused | None:
    """The range a request asks for in a file of ``size`` bytes; None for the whole file."""
    if header is None:
        return None
    m = _RANGE.fullmatch(header)
    if m is None:
        return RangeRefused(400, "want one range: bytes=first-last, bytes=first- or bytes=-n")
    first, last = m.group(1), m.group(2)
    if not first and not last:
        return RangeRefused(400, "empty range")
    if not first:  # suffix: the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            return RangeRefused(416, "empty suffix range")
        return ByteRange(max(0, size - n), size)
    start = int(first)
    if start >= size:
        return RangeRefused(416, f"range starts at or past the end ({size} bytes)")
    if not last:
        return ByteRange(start, size)
    end = int(last)
    if end < start:
        return RangeRefused(416, "inverted range")
    return ByteRange(start, min(end, size - 1) + 1)
