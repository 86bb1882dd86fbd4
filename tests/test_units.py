"""Numbers for people: each formatter's exact output, at the edges where its format changes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from diagnose.units import count, format_value, human_bytes, ms, percent, plain, rate, speedup


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 KB"), (1_500_000, "1.5 MB"), (12.3e9, "12.3 GB"), (-2e6, "-2.0 MB")],
)
def test_human_bytes(value: float, text: str) -> None:
    assert human_bytes(value) == text


def test_percent_speedup_ms_rate() -> None:
    assert percent(0.193) == "19.3%"
    assert percent(0.96782, 0) == "97%"
    assert speedup(2.5) == "2.50x"
    assert [ms(v) for v in (120.4, 12.34, 1.234, 0.1234)] == ["120 ms", "12.3 ms", "1.23 ms", "0.123 ms"]
    assert [rate(v) for v in (1800.4, 99.5, 0)] == ["1,800", "99.50", "0"]


def test_plain_settings() -> None:
    assert plain(None) == "—"
    assert plain(0.1234567) == "0.123457"
    assert plain([1, "a"]) == "1, a"
    assert plain([]) == "—"
    assert plain({"warmup": 5, "stop": True}) == "warmup=5, stop=True"


@dataclass(frozen=True)
class Case:
    value: float | None
    spec: str | None
    unit: str
    text: str


@pytest.mark.parametrize(
    "case",
    [
        Case(None, None, "share", "n/a"),
        Case(0.96782, None, "share", "97%"),
        Case(0.5, "%", "", "50%"),
        Case(1.924, "x", "", "1.92x"),
        Case(4096, None, "bytes", "4.1 KB"),
        Case(4096, "bytes", "count", "4.1 KB"),
        Case(3.14159, ".3f", "", "3.142"),
        Case(3.0, "nonsense", "", "3.0"),
        Case(8.2717, None, "us", "8.3 µs"),
        Case(6.24, None, "ms", "6.2 ms"),
        Case(1.5, None, "s", "1.50 s"),
        Case(12.0, None, "GB/s", "12.0 GB/s"),
        Case(2.0, None, "count", "2"),
        Case(2.345, None, "count", "2.35"),
    ],
    ids=lambda case: f"{case.value}-{case.spec}-{case.unit}",
)
def test_format_value(case: Case) -> None:
    assert format_value(case.value, case.spec, case.unit) == case.text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.19451e9, "1.19 billion"),
        (1_194_510, "1.19 million"),
        (123_456, "123,456"),
        (64, "64"),
        (64.0, "64"),
        (2.5, "2.5"),
        (0.125, "0.125"),
        (1234.6, "1,235"),
        (3.2e12, "3.2 trillion"),
    ],
)
def test_counts_never_in_exponent(value: float, text: str) -> None:
    assert count(value) == text


def test_a_huge_whole_setting_is_written_with_separators() -> None:
    assert plain(1.19451e9) == "1,194,510,000" and plain(0.1) == "0.1"


def test_a_measurement_is_worded_one_way_with_what_a_rerun_reads_where_known() -> None:
    from diagnose.units import measured_words

    assert measured_words(2.4, 0.031) == "measured 2.40x by a short A/B (±3.1%)"
    assert measured_words(2.4, 0.031, (1.8, 3.05)) == "measured 2.40x by a short A/B (±3.1%; a rerun 1.80x-3.05x)"
    assert (
        measured_words(2.4, 0.031, [1.8, 3.05], "num_workers=4")
        == "measured 2.40x by a short A/B (±3.1%; a rerun 1.80x-3.05x; num_workers=4)"
    )
