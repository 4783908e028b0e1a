"""The fast /metrics parser gives exactly prometheus-client's samples, and says which line is wrong."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specscope.read.promtext import ParseError, parse
from tests.conftest import FIXTURES


def reference(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for fam in text_string_to_metric_families(text) for s in fam.samples)


def ours(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted((name, tuple(sorted(labels.items())), v) for name, rows in parse(text).items() for labels, v in rows)


def same(a: list, b: list) -> bool:  # NaN != NaN, so compare them by position
    return len(a) == len(b) and all(x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])))
                                    for x, y in zip(a, b, strict=True))


def test_real_vllm_page_parses_to_prometheus_clients_samples() -> None:
    text = (FIXTURES / "vllm_metrics.txt").read_text()
    got = ours(text)
    assert same(got, reference(text))
    assert any(name == "vllm:spec_decode_num_accepted_tokens_per_pos_total" for name, _, _ in got)


def test_edge_cases_match_prometheus_client() -> None:
    text = "\n".join([
        "# HELP a_total A counter",
        "# TYPE a_total counter",
        'a_total{path="/x",q="say \\"hi\\"\\n",back="c:\\\\d"} 3',
        "b 1.5e3 1700000000000",
        "c NaN",
        'd{le="+Inf"} +Inf',
        "e -Inf",
        'f{a="1",} 2',
        "",
    ])
    assert same(ours(text), reference(text))


def test_garbage_says_which_line() -> None:
    with pytest.raises(ParseError, match="line 2"):
        parse("ok 1\n<html>not metrics</html>\n")
    with pytest.raises(ParseError, match="not a number"):
        parse("x abc\n")


def test_lines_that_are_not_samples_are_refused_as_prometheus_client_refuses_them() -> None:
    lenient = '  indented 1\nx{a="1"}2\n'  # prometheus-client takes these: so does the parser
    assert same(ours(lenient), reference(lenient))
    for bad in ('x{a="1" 2\n', '9lives 1\n', 'name\n', 'x}{ 1\n'):
        with pytest.raises(ParseError, match="line 1"):
            parse(bad)
        with pytest.raises(ValueError):
            reference(bad)
