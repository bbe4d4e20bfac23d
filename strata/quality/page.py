"""The pipeline's one-page quality summary: plots over recent batches, as static HTML.

The page is self-contained (inline SVG and CSS, no scripts, nothing fetched), so it
opens from object storage, a file share or an Airflow link alike. It is built here
from figures already read (ledger rows, batch results, quarantine reasons); writing it
under the quality location is `strata.quality.store`'s.

Much of what it shows comes from outside Strata's control: quarantine reasons can
quote the messages they reject, topics and notes are typed by people. Every such value goes
into the HTML through `_text` (or `_href` for a link), never as it is, so a payload
such as `<script>` is shown, not run.
"""

from __future__ import annotations

import html
from collections import Counter
from typing import Any
from urllib.parse import quote

from strata.quality.checks import LATENESS_LABELS, incomplete_marks, recent_batches
from strata.store.ledger import lag_after

WIDTH, HEIGHT, PAD = 640, 180, 34


def summary_page(
    name: str,
    gate: str,
    history: int,
    ledger: list[dict[str, Any]],
    results: list[dict[str, Any]],
    reasons: dict[str, int],
) -> str:
    """The summary page's HTML, from the ledger, recent results and quarantine reasons.

    Args:
        name: The pipeline's name.
        gate: The quality gate in force.
        history: How many of the newest batches to show.
        ledger: Every ledger row.
        results: The recent batch results, oldest first.
        reasons: Quarantined rows per reason over the batches shown.

    Returns:
        A whole HTML document.
    """
    batches = recent_batches(ledger, history)
    per_batch = {b: [r for r in ledger if r["batch"] == b] for b in batches}
    by_batch = {r["batch"]: r for r in results}
    rows = [sum(r["rows"] for r in per_batch[b]) for b in batches]
    mbytes = [sum(r["bytes"] for r in per_batch[b]) / 1e6 for b in batches]
    lag: list[float] = [
        lag_after([r for r in per_batch[b] if r["kind"] == "ingest"]) or 0 for b in batches
    ]
    lateness = Counter[str]()
    for result in results:
        lateness.update(result.get("lateness", {}))
    hours = Counter[str]()
    for result in results:
        hours.update(result.get("partitions", {}))
    incomplete = incomplete_marks(results)
    labels = [str(b) for b in batches]
    body = [
        f"<h1>{_text(name)}: data quality</h1>",
        f"<p class=sub>{len(batches)} recent batches; gate <b>{_text(gate)}</b>. "
        "Numbers from the ledger; checks from each batch's result.</p>",
        _section("Rows per batch", _bars(labels, rows, "rows")),
        _section("MB per batch", _bars(labels, mbytes, "MB")),
        _section("Lag after each batch (messages)", _bars(labels, lag, "lag")),
        _section(
            "Late arrivals (Kafka time minus event time)",
            _bars(LATENESS_LABELS, [lateness.get(k, 0) for k in LATENESS_LABELS], "rows"),
        ),
        _section(
            "Quarantine reasons",
            _bars(list(reasons), list(reasons.values()), "rows", horizontal=True)
            if reasons
            else "<p>No quarantined rows in these batches.</p>",
        ),
        _section("Event-time partitions", _hours(hours, incomplete)),
        _section("Offsets lost to retention", _losses(ledger)),
        _section("Batches", _batch_table(batches, per_batch, by_batch)),
    ]
    return _PAGE.format(title=_text(f"{name} quality"), body="\n".join(body))


def docs_index(name: str, runs: list[dict[str, Any]]) -> str:
    """The Data Docs index's HTML: every validation documented, newest first.

    Great Expectations' own index draws its table with scripts fetched from public
    CDNs, and lists only what one context holds; this one is static, like the summary
    page, and lists every run.

    Args:
        name: The pipeline's name.
        runs: Every validation documented, as `suite.documented_run` describes it.

    Returns:
        A whole HTML document, linking each validation's page and each suite's page
        relative to the Data Docs directory.
    """
    ordered = sorted(runs, key=lambda r: (r["run_time"], r["run_name"]), reverse=True)
    rows = "".join(
        f"<tr{'' if r['success'] else ' class=bad'}><td>{_text(r['run_time'])}</td>"
        f"<td>{_text(r['run_name'])}</td><td>{_text(r['asset_name'] or '')}</td>"
        f'<td><a href="{_href("expectations/" + r["suite"] + ".html")}">{_text(r["suite"])}</a>'
        f'</td><td><a href="{_href(r["page"])}">{"passed" if r["success"] else "failed"}</a>'
        "</td></tr>"
        for r in ordered
    )
    failed = sum(not r["success"] for r in runs)
    body = [
        f"<h1>{_text(name)}: Data Docs</h1>",
        f"<p class=sub>{len(runs)} validations by Great Expectations, {failed} failed; "
        "newest first. Each batch is validated twice: its rows, and uniqueness over the "
        "table.</p>",
        _section(
            "Validations",
            "<table><tr><th>checked at</th><th>run</th><th>asset</th><th>suite</th>"
            f"<th>result</th></tr>{rows}</table>"
            if runs
            else "<p>No validation yet.</p>",
        ),
    ]
    return _PAGE.format(title=_text(f"{name} data docs"), body="\n".join(body))


def _section(title: str, content: str) -> str:
    return f"<section><h2>{_text(title)}</h2>{content}</section>"


def _bars(labels: list[str], values: list[float], unit: str, horizontal: bool = False) -> str:
    """A bar chart as inline SVG, each bar titled with its exact value."""
    if not values:
        return "<p>No batches yet.</p>"
    top = max(max(values), 1e-9)
    parts = []
    if horizontal:
        # Each label on a line of its own above its bar: a quarantine reason's class
        # is a whole sentence, and the words that tell two classes apart can be last.
        step = 34
        height = step * len(values) + 6
        for i, (label, value) in enumerate(zip(labels, values, strict=True)):
            w = (WIDTH - 80) * value / top
            y = 4 + i * step
            parts.append(
                f'<text x="0" y="{y + 11}" class=lab>{_text(label)}</text>'
                f'<rect x="0" y="{y + 15}" width="{w:.1f}" height="14">'
                f"<title>{_text(f'{label}: {_fmt(value)} {unit}')}</title></rect>"
                f'<text x="{w + 5:.1f}" y="{y + 26}" class=val>{_fmt(value)}</text>'
            )
        return f'<svg viewBox="0 0 {WIDTH} {height}" width="{WIDTH}">{"".join(parts)}</svg>'
    slot = (WIDTH - PAD) / len(values)
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = (HEIGHT - 2 * PAD) * value / top
        x = PAD + i * slot
        bar = min(slot * 0.8, 56)
        parts.append(
            f'<rect x="{x + (slot - bar) / 2:.1f}" y="{HEIGHT - PAD - h:.1f}" width="{bar:.1f}" '
            f'height="{h:.1f}"><title>{_text(f"{label}: {_fmt(value)} {unit}")}</title></rect>'
        )
        if len(values) <= 24:
            parts.append(
                f'<text x="{x + slot / 2:.1f}" y="{HEIGHT - PAD - h - 4:.1f}" class=val '
                f'text-anchor="middle">{_fmt(value)}</text>'
                f'<text x="{x + slot / 2:.1f}" y="{HEIGHT - PAD + 14}" class=lab '
                f'text-anchor="middle">{_text(label)}</text>'
            )
    axis = f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH}" y2="{HEIGHT - PAD}" class=axis />'
    return f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}">{axis}{"".join(parts)}</svg>'


def _hours(hours: Counter[str], incomplete: dict[str, list[int]]) -> str:
    """Rows per event-time partition; partitions a failed gate marked are flagged."""
    if not hours:
        return "<p>No rows yet.</p>"
    cells = []
    for name in sorted(hours)[-96:]:
        marked = incomplete.get(name)
        title = f"{name}: {hours[name]:,} rows" + (
            f"; incomplete (failed quality in batch {', '.join(map(str, marked))})"
            if marked
            else ""
        )
        cells.append(
            f'<div class="hour{" bad" if marked else ""}" title="{_text(title)}">'
            f"<span>{_text(name)}</span><b>{hours[name]:,}</b></div>"
        )
    return f"<div class=hours>{''.join(cells)}</div>"


def _losses(ledger: list[dict[str, Any]]) -> str:
    """Every recorded loss: ranges retention deleted before they were read."""
    lost = [r for r in ledger if r["kind"] == "loss"]
    if not lost:
        return "<p>None recorded.</p>"
    items = "".join(
        f"<li>batch {r['batch']}: offsets [{r['start_offset']:,}, {r['end_offset']:,}) of "
        f"partition {r['partition']} of <code>{_text(r['topic'])}</code> "
        f"({r['end_offset'] - r['start_offset']:,} messages); {_text(r['note'] or '')}</li>"
        for r in lost
    )
    return f"<ul class=losses>{items}</ul>"


def _batch_table(
    batches: list[int], per_batch: dict[int, list[dict[str, Any]]], results: dict[int, Any]
) -> str:
    head = (
        "<tr><th>batch</th><th>kind</th><th>messages</th><th>rows</th><th>quarantined</th>"
        "<th>gaps</th><th>MB</th><th>quality</th><th>failed checks</th></tr>"
    )
    lines = []
    for b in reversed(batches):
        recs = per_batch[b]
        kinds = sorted({r["kind"] for r in recs})
        result = results.get(b)
        if result is None:
            verdict = "not checked"
        else:
            verdict = "passed" if result["success"] else "failed"
            if result.get("docs"):
                verdict = f'<a href="{_href(result["docs"])}">{verdict}</a>'
        failed = (
            ", ".join(
                _text(c["name"] + (f" ({c['column']})" if c.get("column") else ""))
                for c in result["checks"]
                if not c["success"]
            )
            if result
            else ""
        )
        cls = "" if result is None or result["success"] else ' class="bad"'
        lines.append(
            f"<tr{cls} id=batch-{b}><td>{b}</td><td>{_text('/'.join(kinds))}</td>"
            + "".join(
                f"<td class=num>{sum(r[k] for r in recs):,}</td>"
                for k in ("messages", "rows", "quarantined", "gaps")
            )
            + f"<td class=num>{sum(r['bytes'] for r in recs) / 1e6:,.1f}</td>"
            f"<td>{verdict}</td><td>{failed}</td></tr>"
        )
    return f"<table>{head}{''.join(lines)}</table>"


def _text(value: object) -> str:
    """`value` as HTML text, safe in element content and in a quoted attribute alike.

    Quotes are escaped too, so one helper serves both places: a value that closes an
    attribute (`"><img onerror=...>`) stays inside it.
    """
    return html.escape(str(value), quote=True)


def _href(path: str) -> str:
    """A relative link to `path` under the quality location, for an `href` attribute.

    Percent-encoding every character a path does not need (`:` included) keeps the link
    relative, so no stored path can turn into a `javascript:` or other-site URL; the
    result is then escaped like any attribute value.
    """
    return _text(quote(path, safe="/"))


def _fmt(value: float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; max-width: 1100px; }}
h1 {{ font-size: 22px; margin: 0; }} .sub {{ color: #5b6475; margin-top: 4px; }}
section {{ margin: 22px 0; }} h2 {{ font-size: 15px; margin: 0 0 6px; }}
svg rect {{ fill: #3b6fd8; }} svg .val {{ font-size: 10px; fill: #1d2330; }}
svg .lab {{ font-size: 10px; fill: #5b6475; }} svg .axis {{ stroke: #aab; }}
table {{ border-collapse: collapse; }}
td, th {{ padding: 3px 9px; border-bottom: 1px solid #e3e6ee; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
tr.bad td {{ background: #fdecec; }}
.hours {{ display: flex; flex-wrap: wrap; gap: 4px; }}
.hour {{ border: 1px solid #cdd6ea; border-radius: 4px; padding: 3px 6px; background: #eef3fd; }}
.hour span {{ display: block; font-size: 10px; color: #5b6475; }}
.hour.bad {{ background: #fdecec; border-color: #e5a3a3; }}
</style></head>
<body>
{body}
</body></html>
"""
