"""What quality writes under `quality.location`, and reads back.

One JSON result per batch under `results/`, the batch's Data Docs under `docs/` (with
the list of every validation documented, `docs/runs.json`, and its index), and the
pipeline's summary page as `index.html`. The location is a local directory or an
object-store prefix; every write replaces its file atomically, so a reader never sees
half a page.

Completeness asks on every run which partitions a failed gate marked incomplete.
Reading every result for that would cost a read per batch ever checked, so each
batch that marks partitions also writes them under `marks/`, which holds only such
batches, and `marks/ready` says the folder is whole. A location written before the
folder existed is indexed once, from its results, the first time it is asked.

A check writes its marks before its result and settles them after it, so that a crash
between the two holds a partition and never releases one wrongly. Each check has an id,
in its result and in the marks it writes: marks not settled yet are held unless the
result stored is that same check's, which then decides. A check killed after its marks
holds its batch's partitions (whatever an earlier check stored); one killed after a
passing result holds nothing; and the next check of the batch settles either.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from strata import faults
from strata.quality.checks import QualityResult, incomplete_marks
from strata.store.files import filesystem, read_bytes, write_bytes_atomically

if TYPE_CHECKING:
    from strata.store.places import Places

_RESULT_NAME = re.compile(r"^batch-\d{10}\.json$")
# Written once `marks/` holds every batch's marks: from then on it alone is read.
_MARKS_READY = "ready"
# Every validation whose page is under `docs/`: what the Data Docs index is built from.
_RUNS = "runs.json"


@dataclass(frozen=True)
class _Marks:
    """A batch's marks, as `marks/batch-<N>.json` holds them.

    Attributes:
        partitions: The partitions held.
        check: The id of the check that wrote them; None in marks from before checks
            had ids, which are settled.
        settled: Whether that check stored its result and settled them after; if not,
            the result stored says whether they stand.
    """

    partitions: list[str]
    check: str | None = None
    settled: bool = True

    def body(self) -> bytes:
        return json.dumps(
            {"partitions": sorted(self.partitions), "check": self.check, "settled": self.settled}
        ).encode()

    @classmethod
    def of(cls, data: bytes) -> _Marks:
        body = json.loads(data)
        if isinstance(body, list):
            # Written before checks had ids: after the result, as settled marks are.
            return cls([str(p) for p in body])
        return cls(list(body["partitions"]), body.get("check"), bool(body.get("settled")))


class ResultStore:
    """A pipeline's quality location: batch results, Data Docs and the summary page."""

    def __init__(self, uri: str, options: dict[str, str] | None = None) -> None:
        """Open the store at a location.

        Args:
            uri: The quality location: a local path or an `s3://` URI.
            options: Storage options (credentials, endpoint) for the object store.
        """
        self.fs, self.root = filesystem(uri, options or {})
        # As a user names it: the s3:// URI, or the local path made absolute.
        self.location = uri.rstrip("/") if "://" in uri else str(Path(uri).resolve())

    @classmethod
    def of(cls, places: Places) -> ResultStore:
        """The store of a pipeline (or routed table), at its `quality.location`."""
        quality = places.table("quality")
        return cls(quality.uri, quality.options)

    def _path(self, batch: int) -> str:
        return f"{self.root}/results/batch-{batch:010d}.json"

    def _mark_path(self, batch: int) -> str:
        return f"{self.root}/marks/batch-{batch:010d}.json"

    def save(self, result: QualityResult) -> None:
        """Write (or replace) a batch's result, and its marks.

        Marks are written, not settled, before the result, and settled (or removed,
        for a check that holds nothing) after it. A crash before the result leaves the
        partitions of this check and of any earlier marks held; one after it leaves the
        result in charge (see the module's docstring). The next check of the batch puts
        either right.
        """
        check = result.check
        body = json.dumps(asdict(result), indent=1, sort_keys=True, default=str).encode()
        path = self._mark_path(result.batch)
        earlier = self._marks(result.batch)
        if result.incomplete or earlier is not None:
            partitions = set(result.incomplete) | set(earlier.partitions if earlier else [])
            write_bytes_atomically(self.fs, path, _Marks(sorted(partitions), check, False).body())
            faults.reached(faults.QUALITY_MARKS_WRITTEN)
        write_bytes_atomically(self.fs, self._path(result.batch), body)
        faults.reached(faults.QUALITY_RESULT_WRITTEN)
        if result.incomplete:
            write_bytes_atomically(self.fs, path, _Marks(list(result.incomplete), check).body())
        elif earlier is not None:
            _delete_if_present(self.fs, path)

    def _marks(self, batch: int) -> _Marks | None:
        data = read_bytes(self.fs, self._mark_path(batch))
        return None if data is None else _Marks.of(data)

    def _standing(self, batch: int, marks: _Marks) -> list[str]:
        """The partitions a batch's marks hold: all of them, unless the check that wrote
        them stored its result and did not get to settle them, which then decides."""
        if marks.settled:
            return marks.partitions
        result = self.load(batch)
        if result is None or result.get("check") != marks.check:
            return marks.partitions
        return list(result.get("incomplete") or [])

    def load(self, batch: int) -> dict[str, Any] | None:
        """A batch's result, if checked."""
        data = read_bytes(self.fs, self._path(batch))
        return None if data is None else _result(data)

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` results, oldest first."""
        directory = f"{self.root}/results"
        if self.fs.get_file_info(directory).type == pafs.FileType.NotFound:
            return []
        names = sorted(
            info.base_name
            for info in self.fs.get_file_info(pafs.FileSelector(directory))
            if _RESULT_NAME.match(info.base_name)
        )[-limit:]
        out = []
        for name in names:
            data = read_bytes(self.fs, f"{directory}/{name}")
            if data is not None:
                out.append(_result(data))
        return out

    def checked(self) -> set[int]:
        """The batches that have a result, from the names alone (nothing is read)."""
        directory = f"{self.root}/results"
        if self.fs.get_file_info(directory).type == pafs.FileType.NotFound:
            return set()
        return {
            int(info.base_name[6:16])
            for info in self.fs.get_file_info(pafs.FileSelector(directory))
            if _RESULT_NAME.match(info.base_name)
        }

    def incomplete(self) -> dict[str, list[int]]:
        """Event-time partitions marked incomplete by any batch, with those batches.

        Reads `marks/`, which holds only the batches that marked partitions; indexes
        the results into it first if it was never made whole.
        """
        directory = f"{self.root}/marks"
        if read_bytes(self.fs, f"{directory}/{_MARKS_READY}") is None:
            for result in self.recent(10**9):
                if result.get("incomplete"):
                    marks = _Marks(result["incomplete"], result.get("check"))
                    write_bytes_atomically(self.fs, self._mark_path(result["batch"]), marks.body())
            write_bytes_atomically(self.fs, f"{directory}/{_MARKS_READY}", b"")
        held: list[dict[str, Any]] = []
        for info in self.fs.get_file_info(pafs.FileSelector(directory)):
            if _RESULT_NAME.match(info.base_name):
                data = read_bytes(self.fs, info.path)
                if data is not None:
                    batch = int(info.base_name[6:16])
                    standing = self._standing(batch, _Marks.of(data))
                    held.append({"batch": batch, "incomplete": standing})
        return incomplete_marks(sorted(held, key=lambda r: int(r["batch"])))

    def write_page(self, page: str) -> str:
        """Write (or replace) the summary page, `index.html`; returns its path."""
        path = f"{self.root}/index.html"
        write_bytes_atomically(self.fs, path, page.encode())
        return path

    def docs_runs(self) -> list[dict[str, Any]]:
        """Every validation documented under `docs/`, as the Data Docs index lists them."""
        data = read_bytes(self.fs, f"{self.root}/docs/{_RUNS}")
        runs: list[dict[str, Any]] = [] if data is None else json.loads(data)
        return runs

    def save_docs_runs(self, runs: list[dict[str, Any]]) -> None:
        """Replace the list of documented validations, after their pages were copied."""
        body = json.dumps(runs, indent=1, sort_keys=True)
        write_bytes_atomically(self.fs, f"{self.root}/docs/{_RUNS}", body.encode())

    def write_docs_index(self, page: str) -> str:
        """Write (or replace) the Data Docs index, `docs/index.html`; returns its path."""
        path = f"{self.root}/docs/index.html"
        write_bytes_atomically(self.fs, path, page.encode())
        return path

    def copy_docs(self, built: Path, page: str | None) -> str | None:
        """Copy a Data Docs site built locally under `docs/`.

        Args:
            built: The local directory the site was built in; nothing is copied if it
                was not built.
            page: The batch's page, relative to the site.

        Returns:
            The batch's page relative to the quality location, if there is one.
        """
        if not built.is_dir():
            return None
        for path in sorted(built.rglob("*")):
            if path.is_file():
                rel = path.relative_to(built).as_posix()
                write_bytes_atomically(self.fs, f"{self.root}/docs/{rel}", path.read_bytes())
        return None if page is None else f"docs/{page}"

    def where(self, relative: str) -> str:
        """Where a file of the store is opened from: an absolute local path, or its URI.

        Args:
            relative: The file, relative to the quality location (`QualityResult.docs`).
        """
        return f"{self.location}/{relative}"


def _delete_if_present(fs: pafs.FileSystem, path: str) -> None:
    """Delete a file; one that is not there is fine."""
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_file(path)


def _result(data: bytes) -> dict[str, Any]:
    """A stored result; each is a JSON object written by `ResultStore.save`."""
    body: dict[str, Any] = json.loads(data)
    return body
