"""The metrics reference: every Prometheus metric a run or `strata status` exports.

Each metric's name, help and labels are `strata.operations.metrics.METRICS`; its
type is what prometheus-client makes of it there, so the page says what a scrape
reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.operations import metrics
from strata.reference._docstrings import paragraphs
from strata.reference._markdown import cell, code, generated, prose, table


@dataclass(frozen=True)
class Metric:
    """One metric, as a scrape reads it.

    Attributes:
        name: Its name, `strata_*`.
        type: `gauge`, `counter`, ...
        labels: Its labels.
        help: Its help text.
    """

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


def definitions() -> list[Metric]:
    """Every metric, in the exposition's order, each made as a run makes it."""
    out = []
    for name, (_, labels) in metrics.METRICS.items():
        gauges = metrics._Gauges()
        gauges.set(name, 0, **dict.fromkeys(labels, "0"))
        family = next(iter(gauges.registry.collect()))
        out.append(Metric(name, family.type, labels, family.documentation))
    return out


def _intro() -> str:
    """The metrics module's docstring, but for its pointer to this very page."""
    text = "\n\n".join(prose(p) for p in paragraphs(metrics.__doc__))
    return text.replace(" The metrics reference (docs/reference/metrics.md) lists them.", "")


def page() -> str:
    """The page `metrics.md`."""
    rows = [
        (code(m.name), m.type, ", ".join(code(label) for label in m.labels), cell(m.help))
        for m in definitions()
    ]
    return (
        "\n\n".join(
            [
                "# Metrics reference",
                generated("the metric definitions, `strata.operations.metrics.METRICS`"),
                _intro(),
                table(("Name", "Type", "Labels", "Help"), rows),
            ]
        )
        + "\n"
    )
