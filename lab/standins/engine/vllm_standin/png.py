"""A small PNG decoder (8-bit RGB/RGBA, every filter type) and coarse colour naming, for the
vision answer: which colour fills the left half of an image and which the right half.
"""

from __future__ import annotations

import colorsys
import struct
import zlib
from collections import Counter


def _unfilter(ftype: int, line: bytes, prev: bytes, bpp: int) -> bytes:
    """Undo one PNG scanline filter (types 0-4)."""
    if ftype == 0:
        return line
    if ftype == 2:
        return bytes((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
    out = bytearray(line)
    if ftype == 1:
        for i in range(bpp, len(out)):
            out[i] = (out[i] + out[i - bpp]) & 0xFF
    elif ftype == 3:
        for i in range(len(out)):
            left = out[i - bpp] if i >= bpp else 0
            out[i] = (out[i] + ((left + prev[i]) >> 1)) & 0xFF
    elif ftype == 4:
        for i in range(len(out)):
            a = out[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            out[i] = (out[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    else:
        raise ValueError(f"unknown PNG filter type {ftype}")
    return bytes(out)


def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG to (width, height, bytes per pixel, rows)."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG")
    pos, header, idat = 8, None, []
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif ctype == b"IDAT":
            idat.append(body)
        elif ctype == b"IEND":
            break
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        raise ValueError(f"unsupported PNG (bit depth {depth}, colour type {colour}, interlace {interlace})")
    if width * height > 16_000_000:
        raise ValueError("PNG too large")
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    if len(raw) < height * (stride + 1):
        raise ValueError("truncated PNG data")
    rows, prev = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        prev = _unfilter(raw[start], raw[start + 1 : start + 1 + stride], prev, bpp)
        rows.append(prev)
    return width, height, bpp, rows


def colour_name(r: int, g: int, b: int) -> str:
    """Name an sRGB colour coarsely (what a vision model would say)."""
    hue, sat, val = colorsys.rgb_to_hsv(r / 255, g / 255, b / 255)
    if val < 0.25:
        return "black"
    if sat < 0.25:
        return "white" if val > 0.8 else "gray"
    degrees = hue * 360
    for limit, name in ((15, "red"), (40, "orange"), (70, "yellow"), (160, "green"), (200, "cyan")):
        if degrees < limit:
            return name
    for limit, name in ((260, "blue"), (290, "purple"), (345, "magenta")):
        if degrees < limit:
            return name
    return "red"


def dominant_colours(png: bytes) -> tuple[str, str]:
    """Most frequent colour name in the left and in the right half (alpha over white)."""
    width, height, bpp, rows = decode_png(png)
    half = width // 2
    votes: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    step_y = max(1, height // 64)
    step_x = max(1, half // 64)
    for row in rows[::step_y]:
        for x in range(0, width, step_x):
            px = row[x * bpp : x * bpp + bpp]
            alpha = px[3] if bpp == 4 else 255
            rgb = [(c * alpha + 255 * (255 - alpha)) // 255 for c in px[:3]]
            votes[0 if x < half else 1][colour_name(*rgb)] += 1
    left = votes[0].most_common(1)[0][0] if votes[0] else "unknown"
    right = votes[1].most_common(1)[0][0] if votes[1] else "unknown"
    return left, right
