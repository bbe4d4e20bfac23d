"""Data quality of each batch: a Great Expectations suite, reconciliation, and reports.

Each check of a committed batch writes one JSON result, the batch's Data Docs page,
its rows of the quality table and the pipeline's summary page, all under
`quality.location`. The package is split by what its parts touch:

- `checks`: the results and every computation over figures already read (the
  reconciliation checks, lateness and partition counts, the text report); no I/O.
- `page`: the summary page's HTML, built from those figures, and the Data Docs index; no I/O.
- `suite`: the Great Expectations suite, its run and its escaped Data Docs.
- `store`: the quality location: results, the page and the docs.
- `table`: the quality table, each batch's checks and partitions for SQL, and its
  registration in the metastore.
- `run`: `run_quality`, which reads the batch through `strata.store.tables` and ties
  the parts together.

Callers import each name from its module. The package itself imports nothing:
completeness reads the quality marks through `checks` and `store`, while `run`
reaches the catalog (through `table`) and Great Expectations, so a package that
loaded `run` would close an import cycle and make every reader of a mark pay for it.
"""
