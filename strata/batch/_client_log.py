"""librdkafka's log, routed through Strata's logging: each client's lines, rate-limited."""

from __future__ import annotations

import logging
import re
import time

from strata.log import RateLimit, get_logger

# librdkafka prefixes a line with the thread it came from, and ends a failed
# connection with how long it took: neither tells one failure from another.
_THREAD = re.compile(r"^\[thrd:[^\]]*\]:\s*")
_ATTEMPT = re.compile(r"\s*\(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)$")


class ClientLog:
    """librdkafka's log lines, as records of the `strata.batch.kafka.client` logger.

    Without it librdkafka writes to stderr itself: against a dead broker, a line per
    reconnection attempt, hundreds a minute, around the one error that matters. Here
    each line is logged at its level, the same line at most once a minute (with the
    count held back); a failed connection (facility FAIL) at DEBUG only, since the
    client retries it on its own and, once it lasts, the request fails with an error
    of ours that names the brokers and quotes the latest failure.

    confluent-kafka calls `log(level, "%s [%s] %s", facility, client, text)` from the
    thread that serves the client.
    """

    def __init__(self, logger: logging.Logger, window_s: float = 60.0) -> None:
        """Route to a logger.

        Args:
            logger: Where the records go.
            window_s: How long a line is held back after it was logged.
        """
        self.logger = logger
        self.limit = RateLimit(window_s)
        self._failure: tuple[float, str] | None = None

    def log(self, level: int, msg: str, *args: object) -> None:
        """Log one librdkafka line (the method confluent-kafka calls)."""
        if len(args) == 3:
            facility, text = str(args[0]), str(args[2])
        else:
            facility, text = "", msg % args if args else msg
        text = _THREAD.sub("", text)
        if facility == "FAIL":
            self._failure = (time.monotonic(), _ATTEMPT.sub("", text))
            level = logging.DEBUG
        if not self.logger.isEnabledFor(level):
            return
        held = self.limit.admit((level, facility, _ATTEMPT.sub("", text)))
        if held is None:
            return
        more = f" ({held:,} more like it in the last {self.limit.window_s:.0f}s)" if held else ""
        self.logger.log(level, "kafka client: %s%s", text, more)

    def failure_since(self, seconds: float) -> str | None:
        """The latest failed connection, if it came in the last `seconds`."""
        failure = self._failure
        if failure is None or time.monotonic() - failure[0] > seconds:
            return None
        return failure[1]


CLIENT_LOG = ClientLog(get_logger("strata.kafka.client"))
"""The log of every Kafka client this process makes (one rate limit for them all)."""
