"""`BENCH_SECTIONS`: which sections of `make bench` run, and in what order."""

from __future__ import annotations

import pytest

from bench.run_bench import SECTIONS, chosen_sections


@pytest.mark.parametrize("text", [None, "", "  ", ","])
def test_nothing_named_runs_every_section_in_order(text):
    assert chosen_sections(text) == list(SECTIONS)
    assert list(SECTIONS)[:2] == ["1m", "shuffle"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The table's rows compare with the references and strata 1M, which come first.
        ("partitions 3m", ["1m", "3m", "partitions"]),
        ("where,maintenance", ["1m", "where", "maintenance"]),
        ("hours", ["1m", "hours"]),
        # Sections that stand alone bring nothing else.
        ("formats, history", ["history", "formats"]),
        ("1m 1m", ["1m"]),
    ],
)
def test_named_sections_run_in_order_with_what_they_need(text, expected):
    assert chosen_sections(text) == expected


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"no section 3M, tabel; they are: 1m \(") as refused:
        chosen_sections("tabel 3m 3M")
    assert "partitions (4,096 partitions against 8)" in str(refused.value)
