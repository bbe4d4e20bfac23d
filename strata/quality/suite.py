"""The Great Expectations suite of a batch: its expectations, its run, its Data Docs.

The suite runs on a pandas DataFrame of the batch's rows, made from the Arrow table
they were read into: Strata reads and writes its tables with delta-rs and Arrow
(local or S3), and a Spark DataFrame would be a copy of the same rows made through
the driver; Spark has no Delta or S3 connector in this deployment.

Great Expectations 1.x escapes the parameters of its sentences but writes unexpected
values, observed values and exception tracebacks into Data Docs as raw HTML, and those
hold message text. The docs are therefore built from a copy of each validation result
in which that text is escaped (`_inert_for_docs`); the checks keep it as it is.

Great Expectations is imported inside the functions: it takes seconds to import, and
a command that never checks quality should not pay for it.
"""

from __future__ import annotations

import copy
import functools
import html
import json
import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import pyarrow as pa

from strata.durations import parse_duration_ms
from strata.errors import QualityError
from strata.quality.checks import COORDINATES, Check

if TYPE_CHECKING:
    from great_expectations.core.expectation_validation_result import (
        ExpectationSuiteValidationResult,
    )
    from great_expectations.data_context.types.resource_identifiers import (
        ValidationResultIdentifier,
    )

    from strata.config import QualityConfig


def _import_quietly() -> None:
    """Import Great Expectations once, without its import-time warnings and chatter.

    The functions then import what they use from it as usual, so it stays typed.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import great_expectations  # noqa: F401
        import great_expectations.expectations  # noqa: F401
    logging.getLogger("great_expectations").setLevel(logging.ERROR)


def suite_expectations(
    rules: QualityConfig, columns: Sequence[str], required: Sequence[str], committed_at: datetime
) -> list[Any]:
    """The pipeline's expectations on a batch's rows: the defaults, then the config's.

    Args:
        rules: The pipeline's quality settings.
        columns: The data table's columns, exactly.
        required: Fields of the topic's schema that must never be null.
        committed_at: When the batch committed; event times are expected within
            `max_lateness` before it and `max_skew` after it.

    Returns:
        The expectations, as Great Expectations objects.

    Raises:
        QualityError: If an expectation in the config is unknown to Great
            Expectations, or its kwargs do not fit it.
    """
    _import_quietly()
    import great_expectations.expectations as gxe

    oldest = committed_at - timedelta(milliseconds=parse_duration_ms(rules.max_lateness))
    newest = committed_at + timedelta(milliseconds=parse_duration_ms(rules.max_skew))
    out: list[Any] = [gxe.ExpectTableColumnsToMatchSet(column_set=list(columns), exact_match=True)]
    for name in (*required, *COORDINATES, "_event_time"):
        out.append(gxe.ExpectColumnValuesToNotBeNull(column=name))
    out.append(
        gxe.ExpectColumnValuesToBeBetween(column="_event_time", min_value=oldest, max_value=newest)
    )
    for column, rule in rules.ranges.items():
        out.append(
            gxe.ExpectColumnValuesToBeBetween(column=column, min_value=rule.min, max_value=rule.max)
        )
    for column, values in rules.value_sets.items():
        out.append(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=values))
    for number, custom in enumerate(rules.expectations):
        class_name = "".join(part.capitalize() for part in custom.type.split("_"))
        kind = getattr(gxe, class_name, None)
        if kind is None:
            raise QualityError(
                f"quality.expectations[{number}].type {custom.type!r} is not an expectation of "
                "Great Expectations 1.x; see the expectation gallery for the names"
            )
        try:
            out.append(kind(**custom.kwargs))
        except Exception as exc:  # noqa: BLE001 - GX raises pydantic errors of its own
            raise QualityError(
                f"quality.expectations[{number}] ({custom.type}): its kwargs do not fit: "
                f"{str(exc).splitlines()[0]}"
            ) from None
    return out


# Great Expectations keeps its current project (the data context) process-wide: suites
# run at once, by the tables of a routed pipeline taking their turns together, would
# validate in each other's context. They run one at a time.
_ONE_SUITE_AT_A_TIME = threading.Lock()

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_at_a_time(run: Callable[_P, _R]) -> Callable[_P, _R]:
    """`run`, holding `_ONE_SUITE_AT_A_TIME` while it runs."""

    @functools.wraps(run)
    def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _ONE_SUITE_AT_A_TIME:
            return run(*args, **kwargs)

    return locked


@_one_at_a_time
def run_suite(
    name: str,
    batch: int,
    expectations: list[Any],
    rows: pa.Table,
    neighbours: pa.Table,
    docs_dir: Path,
) -> tuple[list[Check], str | None, list[dict[str, Any]]]:
    """Run the suite on the batch's rows, and table-wide uniqueness on their neighbours.

    Args:
        name: The pipeline's name, which names the suites.
        batch: The batch checked.
        expectations: The suite's expectations (`suite_expectations`).
        rows: The rows to validate (the batch's, or a sample of them).
        neighbours: Coordinates of every row of the table within the batch's offsets,
            of any batch: a message landed twice must show as a duplicate.
        docs_dir: A local directory to build the Data Docs pages in (no index).

    Returns:
        A check per expectation run, the Data Docs page of the batch's rows relative
        to the site, and this run's validations as the index lists them
        (`documented_run`).
    """
    _import_quietly()
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
    )

    # In memory, with no docs site of its own (GX's default one is a stray temp dir).
    context = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False)
        ),
    )
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.add_data_docs_site(
        "strata",
        {
            "class_name": "SiteBuilder",
            "store_backend": {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(docs_dir),
            },
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    source = context.data_sources.add_pandas("strata")
    rows_def = source.add_dataframe_asset("rows").add_batch_definition_whole_dataframe("batch")
    coords_def = source.add_dataframe_asset("table").add_batch_definition_whole_dataframe("batch")
    suite = context.suites.add(gx.ExpectationSuite(f"{name}"))
    for expectation in expectations:
        suite.add_expectation(expectation)
    unique = context.suites.add(gx.ExpectationSuite(f"{name}_table"))
    unique.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(column_list=COORDINATES))
    run_id = gx.RunIdentifier(run_name=f"batch-{batch:010d}")
    checks: list[Check] = []
    page = None
    documented_runs: list[dict[str, Any]] = []
    # What the docs are built from: each suite's page and each validation result.
    documented: list[Any] = [ExpectationSuiteIdentifier(name=s.name) for s in (suite, unique)]
    for suite_, definition, frame in ((suite, rows_def, rows), (unique, coords_def, neighbours)):
        validation = context.validation_definitions.add(
            gx.ValidationDefinition(data=definition, suite=suite_, name=f"{suite_.name}-{batch}")
        )
        # No UpdateDataDocsAction: it would render the stored result as it is, message
        # text included; the docs are built below from an escaped copy.
        checkpoint = context.checkpoints.add(
            gx.Checkpoint(
                name=f"{suite_.name}-{batch}",
                validation_definitions=[validation],
                result_format={"result_format": "SUMMARY"},
            )
        )
        outcome = checkpoint.run(batch_parameters={"dataframe": frame.to_pandas()}, run_id=run_id)
        for key, result in outcome.run_results.items():
            context.validation_results_store.set(key, _inert_for_docs(result))
            documented.append(key)
            documented_runs.append(documented_run(key, bool(result.success), result.asset_name))
            if page is None:
                page = documented_runs[-1]["page"]
            for r in result.results:
                config = r.expectation_config
                assert config is not None  # every result of a suite run names its expectation
                kwargs = config.kwargs
                column = kwargs.get("column") or (
                    ",".join(kwargs["column_list"]) if "column_list" in kwargs else None
                )
                detail = ""
                unexpected = int(r.result.get("unexpected_count") or 0)
                if r.exception_info.get("raised_exception"):
                    detail = f"could not run: {r.exception_info.get('exception_message')}"
                elif not r.success:
                    sample = r.result.get("partial_unexpected_list") or r.result.get(
                        "observed_value"
                    )
                    detail = f"{unexpected:,} unexpected; e.g. {_short(sample)}"
                checks.append(Check(config.type, bool(r.success), column, detail, unexpected))
    # No index: this context holds this run's validations alone, and GX's index draws
    # its table with scripts from public CDNs. `page.docs_index` lists every run.
    context.build_data_docs(
        site_names=["strata"], resource_identifiers=documented, build_index=False
    )
    return checks, page, documented_runs


def documented_run(
    key: ValidationResultIdentifier, success: bool, asset: str | None
) -> dict[str, Any]:
    """A validation's entry in the Data Docs index, as JSON values.

    Args:
        key: The validation result's key in its store.
        success: Whether the validation passed.
        asset: The data asset validated.
    """
    run_id = key.run_id
    return {
        "suite": key.expectation_suite_identifier.name,
        "run_name": run_id.run_name,
        "run_time": run_id.run_time.isoformat(timespec="seconds"),
        "asset_name": asset,
        "success": success,
        # GX leaves `to_tuple` unannotated.
        "page": "validations/" + "/".join(key.to_tuple()) + ".html",  # type: ignore[no-untyped-call]
    }


def _inert_for_docs(result: ExpectationSuiteValidationResult) -> ExpectationSuiteValidationResult:
    """A copy of a suite's validation result that Data Docs can render safely.

    GX 1.x puts unexpected values, observed values (and the tables some expectations
    draw from them) and exception tracebacks into its pages without escaping them; its
    Jinja templates are `.j2` files, which its `select_autoescape(["html", "xml"])`
    leaves unescaped. Those values come from the messages, so they are escaped here,
    once. Exception messages are left alone: GX passes them as sentence parameters,
    which it escapes itself.

    Args:
        result: A suite's validation result; it is left unchanged.

    Returns:
        The copy, for the validation results store that the docs are built from.
    """
    from great_expectations.util import convert_to_json_serializable

    inert = copy.deepcopy(result)
    for one in inert.results:
        # The store keeps results as JSON; converting first makes bytes, dates and
        # numpy values the strings and numbers the renderers will see.
        one.result = _escaped(convert_to_json_serializable(one.result))
        info = one.exception_info
        # Either one exception, or one per metric that raised (keyed by metric id).
        for raised in [info] if "exception_traceback" in info else list(info.values()):
            if isinstance(raised, dict) and raised.get("exception_traceback"):
                raised["exception_traceback"] = html.escape(str(raised["exception_traceback"]))
    return inert


def _escaped(value: Any) -> Any:  # noqa: ANN401 - any JSON value
    """`value` with every string in it (keys too) HTML-escaped; numbers are kept."""
    if isinstance(value, str):
        return html.escape(value, quote=True)
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return html.escape(str(value), quote=True)


def _short(sample: Any) -> str:  # noqa: ANN401 - GX's result values are untyped
    text = json.dumps(sample, default=str)
    return text if len(text) < 200 else text[:197] + "..."
