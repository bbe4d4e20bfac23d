"""`strata status`: the time left before size-based retention deletes unread messages.

The command against the real broker is in tests/integration/test_status.py.
"""

from __future__ import annotations

import pytest

from strata.status import size_time_left


def test_size_based_retention_is_estimated_from_message_size_and_produce_rate():
    # 1,000 unread messages of 200 bytes against 1 MB: 800 kB of room, filled at
    # 50 msgs/s x 200 bytes = 10 kB/s, so 80 s.
    assert size_time_left(1_000_000, 1_000, 200.0, 50.0) == pytest.approx(80.0)
    # Already over the limit: the broker may be deleting unread messages now.
    assert size_time_left(100_000, 1_000, 200.0, 50.0) == 0.0
    # Not growing, or the rate is unknown: no deadline to give.
    assert size_time_left(1_000_000, 1_000, 200.0, 0.0) is None
    assert size_time_left(1_000_000, 1_000, 200.0, None) is None
