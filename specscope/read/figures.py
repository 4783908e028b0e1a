"""Self-contained HTML pages with matplotlib figures, for ``specscope report`` and ``specscope evaluate``: a figure
drawn to PNG off-screen (Agg), embedded as a data URL, and the page around it (style, tables). Nothing is fetched
when a page is opened. matplotlib is the ``report`` extra, imported only when a figure is drawn.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Iterable
from typing import Any

_CSS = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:right}
th{background:#f4f4f4}pre{background:#f7f7f7;padding:.6rem;overflow-x:auto;font-size:.8rem}
img{max-width:100%}.na{color:#777;font-style:italic}"""


def matplotlib_missing() -> str | None:
    """The one-line error where matplotlib is not installed; None where it is."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "the HTML report draws with matplotlib: pip install 'specscope[report]'"
    return None


def draw_png(draw: Callable[[Any], None], width: float = 6.4, height: float = 3.2) -> bytes:
    """A PNG of one axes that ``draw`` fills (a light grid added)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=110)
    try:
        draw(ax)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def img(png: bytes, alt: str) -> str:
    """``png`` as an ``<img>`` that holds it."""
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def html_table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """A table of escaped cells."""
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def na(text: str) -> str:
    """What a page cannot show, and why."""
    return f'<p class="na">{html.escape(text)}</p>'


def html_page(title: str, body: str, style: str = "") -> str:
    """The page: ``body`` (HTML) under the shared style and ``style``."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}{style}</style></head><body>{body}</body></html>")
