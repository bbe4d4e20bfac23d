"""What the Data Docs are built from: message text escaped once, numbers kept.

Great Expectations itself is not imported here (it takes seconds); the suite's run and
its pages are checked in tests/integration/quality.
"""

from __future__ import annotations

from strata.quality.suite import _escaped, _short


def test_every_string_of_a_result_is_escaped_keys_included_and_numbers_are_kept():
    value = {
        "<k>": ["<script>", 'a"b', ("t'", 3)],
        "observed_value": 2.5,
        "ok": True,
        "none": None,
        "bytes": b"<b>",
    }
    assert _escaped(value) == {
        "&lt;k&gt;": ["&lt;script&gt;", "a&quot;b", ["t&#x27;", 3]],
        "observed_value": 2.5,
        "ok": True,
        "none": None,
        "bytes": "b&#x27;&lt;b&gt;&#x27;",
    }


def test_a_sample_in_a_check_detail_is_cut_to_stay_readable():
    assert _short(["a", 1]) == '["a", 1]'
    long = _short(["x" * 300])
    assert len(long) == 200 and long.endswith("...") and long.startswith('["xxx')
