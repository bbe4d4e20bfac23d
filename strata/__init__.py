"""Strata: batch ingestion from Kafka into event-time Delta tables, exactly once."""

__version__ = "0.1.0"
