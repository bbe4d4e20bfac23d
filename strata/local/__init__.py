"""The local stack for development, the demo, the tests and the benchmark.

A Kafka-wire broker (Tansu), Apache Kafka itself and Trino (from what `make setup`
fetches into the user's cache, as it does the delta-spark jars), the Hive Metastore
and the Spark Thrift server from the pyspark jars, a Spark standalone cluster, their
supervision, and the demo's click events. Installed with the `local` extra; nothing
outside this package imports it, so a deployment never needs it and executors never
receive it.
"""
