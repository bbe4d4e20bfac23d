"""Strata: batch ingestion from Kafka into event-time Delta tables, exactly once."""

import logging

__version__ = "0.1.0"

# A library adds no handler of its own: its host's logging decides (see `strata.log`).
logging.getLogger("strata").addHandler(logging.NullHandler())
