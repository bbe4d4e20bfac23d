-- Every batch, partition by partition: the offsets it read and where they went.
-- `unreconciled` must be 0: offsets = rows + quarantined + gaps.
SELECT
  batch,
  kind,
  topic,
  "partition",
  start_offset,
  end_offset,
  messages,
  "rows",
  quarantined,
  gaps,
  end_offset - start_offset - "rows" - quarantined - gaps AS unreconciled,
  committed_at
FROM strata.clicks_ledger
ORDER BY batch, topic, "partition"
