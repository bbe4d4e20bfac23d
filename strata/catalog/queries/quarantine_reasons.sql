-- Why messages were quarantined, most frequent first, with where to find them.
SELECT
  reason,
  count(*) AS messages,
  min(_batch) AS first_batch,
  max(_batch) AS last_batch
FROM strata.clicks_quarantine
GROUP BY reason
ORDER BY messages DESC, reason
