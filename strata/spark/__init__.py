"""Spark: the session a run builds, the JVM it runs in, and the Python daemon of its workers.

- `session`: the session, and the execution of a batch's (or a compaction's) tasks;
- `jvm`: the Java check, the JVM options, the driver's class archive;
- `daemon`: Spark's Python daemon, importing PySpark from its installed package.
"""
