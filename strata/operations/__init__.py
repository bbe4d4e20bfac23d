"""What operators do and see: status, metrics, the ways out of a stop, backfill and replay.

- `status`: committed ranges, batch history and lag;
- `metrics`: Prometheus metrics of every run and of `strata status`;
- `report`: the run summary;
- `recovery`: abandoning a plan, moving where reading goes on;
- `backfill`: committed ranges processed again, replacing their rows;
- `routes`: the tables of a pipeline that routes its topics to tables of their own.
"""
