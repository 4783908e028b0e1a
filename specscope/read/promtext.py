"""A fast parser for the Prometheus text exposition format, for scraping engines' ``/metrics`` pages.

prometheus-client's ``text_string_to_metric_families`` walks each line character by character; a dashboard that
scrapes several engines every second pays for that. This parser handles the same format (comments, labels with
escapes, ``NaN``/``±Inf``, optional timestamps) with string methods per line and one regular expression per
distinct label set, and returns the same samples: ``{name: [(labels, value), ...]}``. The tests hold it to
prometheus-client's values on a real vLLM page.
"""

from __future__ import annotations

import re

#: A metric name; each distinct one is checked once per page.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
#: One label: name = "value" (the value's escapes matched as whole pairs, without per-character alternation).
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r'\\[\\"n]')

Samples = dict[str, list[tuple[dict[str, str], float]]]


class ParseError(ValueError):
    """The page is not in the Prometheus text format."""


def _unescape(v: str) -> str:
    return _ESCAPE.sub(lambda e: _ESCAPES[e.group(0)], v) if "\\" in v else v


def _labels(raw: str) -> dict[str, str]:
    if "\\" not in raw:
        return dict(_LABEL.findall(raw))
    return {k: _unescape(v) for k, v in _LABEL.findall(raw)}


def parse(text: str) -> Samples:
    """Every sample of the page, by sample name (``_total``, ``_bucket``, ``_sum`` suffixes kept).

    Line by line with string methods: a comment or blank line costs one test; a sample's labels sit between its
    first ``{`` and last ``}``, its value is the first field after them (an optional timestamp is ignored).
    Samples that share a label set share one (read-only) labels dict: a page repeats a few label sets many times.
    """
    out: Samples = {}
    seen: dict[str, dict[str, str]] = {"": {}}
    names: dict[str, bool] = {}
    for n, line in enumerate(text.split("\n")):
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            name, raw, fields = line[:brace].strip(), line[brace + 1:close], line[close + 1:].split()
            if close < brace:
                fields = []
        else:
            name, *fields = line.split() or ("",)
            raw = ""
        valid = names.get(name)
        if valid is None:
            valid = names[name] = _NAME.fullmatch(name) is not None
        if not fields or not valid:
            if not line.strip():
                continue
            raise ParseError(f"line {n + 1} is not a sample: {line[:80]!r}")
        labels = seen.get(raw)
        if labels is None:
            labels = seen[raw] = _labels(raw)
        try:
            number = float(fields[0])
        except ValueError:
            raise ParseError(f"sample {name}: {fields[0]!r} is not a number") from None
        bucket = out.get(name)
        if bucket is None:
            out[name] = [(labels, number)]
        else:
            bucket.append((labels, number))
    return out
