-- How late rows arrived: hours between the event and its Kafka timestamp
-- (0 = on time; 48 = two days or more).
SELECT
  least(greatest(date_diff('hour', _event_time, _kafka_ts), 0), 48) AS lateness_hours,
  count(*) AS row_count
FROM strata.clicks
GROUP BY 1
ORDER BY 1
