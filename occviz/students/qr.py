"""A link as a QR code, inline SVG for the page: it scales with the panel, large in presenter mode."""

from __future__ import annotations

import segno
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe


def qr_svg(url: str, label: str) -> SafeString:
    """The QR code of `url` as an <svg> (segno's own markup, no user text in it), labelled for screen readers."""
    svg = segno.make(url, error="m").svg_inline(scale=4, border=2, omitsize=True, svgclass="student-link-qr")
    # segno writes the element; only the accessible name is added, escaped.
    opening = format_html('<svg role="img" aria-label="{}" ', label)
    return mark_safe(svg.replace("<svg ", opening, 1))
