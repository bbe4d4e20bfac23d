-- Freshness of each event-time partition: its newest event, the last arrival in
-- Kafka that landed in it, and the last batch that added to it.
SELECT
  dt,
  hr,
  max(_event_time) AS newest_event,
  max(_kafka_ts) AS last_arrival,
  max(_batch) AS last_batch,
  count(*) AS row_count
FROM strata.clicks
GROUP BY dt, hr
ORDER BY dt DESC, hr DESC
