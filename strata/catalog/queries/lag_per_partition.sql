-- Lag per partition when its latest batch was planned: the broker's high watermark
-- then, minus what that batch committed. For live lag, use `strata status`.
SELECT
  topic,
  "partition",
  end_offset AS committed_offset,
  high_watermark,
  high_watermark - end_offset AS lag_at_commit,
  committed_at
FROM (
  SELECT
    *,
    row_number() OVER (PARTITION BY topic, "partition" ORDER BY batch DESC) AS newest
  FROM strata.clicks_ledger
) AS latest
WHERE newest = 1
ORDER BY topic, "partition"
