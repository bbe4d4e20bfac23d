-- Rows landed per event hour, newest first.
SELECT dt, hr, count(*) AS row_count
FROM strata.clicks
GROUP BY dt, hr
ORDER BY dt DESC, hr DESC
