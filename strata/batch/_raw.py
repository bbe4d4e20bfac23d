"""Reading a batch's messages back from the raw copy instead of Kafka."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from strata.batch._gaps import RangeProgress
from strata.batch._messages import RawChunk
from strata.errors import ReadError
from strata.schema.avro import RAW_SCHEMA
from strata.store.ranges import OffsetRange


def _length(column: pa.ChunkedArray) -> int:
    return int(pc.sum(pc.binary_length(column)).as_py() or 0)


def read_raw_copy(
    raw_uri: str,
    storage_options: dict[str, str] | None,
    ranges: list[OffsetRange],
    batch: int,
    progress: dict[tuple[str, int, int], RangeProgress],
    only_batch: int | None = None,
    files: tuple[str, ...] | None = None,
) -> Iterator[RawChunk]:
    """Yield the raw copy's messages of the ranges, as `read_ranges` yields Kafka's.

    A backfill of offsets that Kafka's retention has deleted reads them here: the raw
    copy holds every message ever read, with its key, value, headers, timestamp and
    whatever the client could not read of it. Its files come in no particular order,
    so offsets are summed but neither checked for order nor split into gap runs, and
    there is no broker to confirm gaps with. Each offset must appear once: after a
    topic was re-created and read again from its start, the raw copy holds two
    messages at one offset, and reading both would land both.

    Args:
        raw_uri: The raw copy's Delta table.
        storage_options: Object-store options for deltalake.
        ranges: Ranges to read.
        batch: Batch number stamped on each row.
        progress: Filled in place, keyed by (topic, partition, start).
        only_batch: Read only the rows this batch wrote (a batch resumed from its own
            committed raw copy).
        files: The raw copy's files to read, relative to its root, where it is not a
            Delta table (Iceberg: the driver lists its current snapshot's).

    Yields:
        Chunks in `RAW_SCHEMA`.

    Raises:
        ReadError: If the raw copy holds an offset of a range more than once.
    """
    # Imported here: pyarrow.dataset brings pandas along, seconds of CPU in every Spark
    # worker that only reads from Kafka.
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    from strata.store.delta import range_filter

    if files is None:
        dataset = DeltaTable(raw_uri, storage_options=storage_options).to_pyarrow_dataset()
    else:
        from strata.store.files import filesystem

        fs, root = filesystem(raw_uri, storage_options or {})
        dataset = ds.dataset([f"{root}/{f}" for f in files], filesystem=fs, format="parquet")
    present = [name for name in RAW_SCHEMA.names if name in dataset.schema.names]
    for r in ranges:
        state = progress.setdefault((r.topic, r.partition, r.start), RangeProgress(r))
        wanted = range_filter(r)
        if only_batch is not None:
            wanted = wanted & (ds.field("_batch") == only_batch)
        seen: list[pa.Array] = []
        for chunk in dataset.to_batches(filter=wanted, columns=present):
            if chunk.num_rows == 0:
                continue
            table = pa.Table.from_batches([chunk])
            for name in RAW_SCHEMA.names:
                if name not in present:  # a raw copy written before the column existed
                    table = table.append_column(name, pa.nulls(table.num_rows, pa.string()))
            table = table.select(RAW_SCHEMA.names).cast(RAW_SCHEMA)
            table = table.set_column(
                RAW_SCHEMA.get_field_index("_batch"),
                RAW_SCHEMA.field("_batch"),
                pa.repeat(pa.scalar(batch, pa.int64()), table.num_rows),
            )
            offsets = table.column("_offset")
            seen.append(offsets.combine_chunks())
            state.messages += table.num_rows
            state.bytes += _length(table.column("_value")) + _length(table.column("_key"))
            state.offset_sum += pc.sum(offsets).as_py()
            low, high = pc.min(offsets).as_py(), pc.max(offsets).as_py()
            state.first_offset = low if state.first_offset is None else min(state.first_offset, low)
            state.last_offset = high if state.last_offset is None else max(state.last_offset, high)
            errors = table.column("_read_error")
            rejected = {
                int(i): errors[int(i)].as_py()
                for i in pc.indices_nonzero(pc.is_valid(errors)).to_pylist()
            }
            yield RawChunk(table, rejected)
        if seen and pc.count_distinct(pa.chunked_array(seen)).as_py() != state.messages:
            counts = pa.chunked_array(seen).value_counts()
            twice = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
            raise ReadError(
                f"{r.describe()}: the raw copy holds offset {twice[0].as_py()} (and "
                f"{len(twice) - 1} more) more than once: two logs were read under these "
                "offsets (a topic deleted and created again, then read from its start). "
                "Nothing was committed; give a range only one log covers."
            )
        state.done = True
