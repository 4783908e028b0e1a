"""A fast parser for the Prometheus text exposition format, for scraping engines' ``/metrics`` pages.

prometheus-client's ``text_string_to_metric_families`` walks each line character by character; a dashboard that
scrapes several engines every second pays for that. This parser handles the same format (comments, labels with
escapes, ``NaN``/``±Inf``, optional timestamps) with one regular expression per line and returns the same
samples: ``{name: [(labels, value), ...]}``. The tests hold it to prometheus-client's values on a real vLLM page.
"""

from __future__ import annotations

import re

#: A sample line: name, optional {labels}, value (an optional timestamp after it is ignored). Comments and blank
#: lines do not match; anything else that does not match is caught by counting lines.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)[^\n]*$", re.M)
_OTHER = re.compile(r"^(?!#|[ \t]*$).*$", re.M)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r'\\[\\"n]')

Samples = dict[str, list[tuple[dict[str, str], float]]]


class ParseError(ValueError):
    """The page is not in the Prometheus text format."""


def _labels(raw: str) -> dict[str, str]:
    out = {}
    for m in _LABEL.finditer(raw):
        v = m.group(2)
        out[m.group(1)] = _ESCAPE.sub(lambda e: _ESCAPES[e.group(0)], v) if "\\" in v else v
    return out


def parse(text: str) -> Samples:
    """Every sample of the page, by sample name (``_total``, ``_bucket``, ``_sum`` suffixes kept).

    Samples that share a label set share one (read-only) labels dict: a page repeats a few label sets many times.
    """
    out: Samples = {}
    seen: dict[str, dict[str, str]] = {"": {}}
    count = 0
    for m in _SAMPLE.finditer(text):
        count += 1
        name, raw, value = m.groups()
        raw = raw or ""
        labels = seen.get(raw)
        if labels is None:
            labels = seen[raw] = _labels(raw)
        try:
            number = float(value)
        except ValueError:
            raise ParseError(f"sample {name}: {value!r} is not a number") from None
        bucket = out.get(name)
        if bucket is None:
            out[name] = [(labels, number)]
        else:
            bucket.append((labels, number))
    if count != sum(1 for _ in _OTHER.finditer(text)):
        bad = next(m for m in _OTHER.finditer(text) if not _SAMPLE.match(m.group(0)))
        line = text.count("\n", 0, bad.start()) + 1
        raise ParseError(f"line {line} is not a sample: {bad.group(0)[:80]!r}")
    return out
