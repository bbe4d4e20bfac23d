"""Filesystems for table and state locations: local paths or s3:// URIs.

Object-store options follow delta-rs's names (`AWS_ENDPOINT_URL`, `AWS_REGION`,
`AWS_ALLOW_HTTP`, ...), so one `storage_options` mapping serves both the Parquet
writers (pyarrow) and the Delta commits (deltalake). Unset options fall back to the
process environment, where credentials belong.

Conditional writes (`put_if_absent`) and the small listing, reading and deleting
functions beside it go through obstore on object stores, because S3's create-if-absent
(`If-None-Match: *`) has no pyarrow equivalent; locally they use the OS directly.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pyarrow.fs as pafs

from strata.errors import StorageError

if TYPE_CHECKING:
    from obstore.store import S3Config, S3Store

_S3_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ALLOW_HTTP",
)


def delta_options(uri: str, options: dict[str, str]) -> dict[str, str] | None:
    """Storage options for deltalake: config first, then the environment.

    Args:
        uri: The table location.
        options: The pipeline's `storage_options`.

    Returns:
        Options for deltalake, or None for local paths.
    """
    if not uri.startswith("s3://"):
        return None
    merged = {k: os.environ[k] for k in _S3_KEYS if k in os.environ}
    merged.update({k.upper(): v for k, v in options.items()})
    # Without DynamoDB locking, delta-rs needs the store's conditional put for safe commits.
    merged.setdefault("conditional_put", "etag")
    return merged


def filesystem(uri: str, options: dict[str, str]) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it for a location.

    Args:
        uri: A local path or an s3:// URI.
        options: The pipeline's `storage_options`.

    Returns:
        The filesystem and the path to use with it.
    """
    if not uri.startswith("s3://"):
        return pafs.LocalFileSystem(), uri
    opts = delta_options(uri, options) or {}
    endpoint = opts.get("AWS_ENDPOINT_URL")
    scheme = "https"
    if endpoint and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
    fs = pafs.S3FileSystem(
        access_key=opts.get("AWS_ACCESS_KEY_ID"),
        secret_key=opts.get("AWS_SECRET_ACCESS_KEY"),
        session_token=opts.get("AWS_SESSION_TOKEN"),
        region=opts.get("AWS_REGION") or opts.get("AWS_DEFAULT_REGION") or "us-east-1",
        endpoint_override=endpoint,
        scheme=scheme,
    )
    return fs, uri[len("s3://") :]


def write_bytes_atomically(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write a small file so that readers see the old content or the new, never a part.

    Args:
        fs: The filesystem.
        path: Destination path.
        data: The content.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
    else:
        # An object store's PUT is atomic: the object appears whole or not at all.
        with fs.open_output_stream(path) as out:
            out.write(data)


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    """Read a small file, or None if it does not exist."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as src:
        return bytes(src.read())


def _object_store(uri: str, options: dict[str, str]) -> tuple[S3Store, str]:
    """An obstore store for an s3:// location's bucket, and the key inside it.

    The options are merged exactly as for deltalake (`delta_options`): the pipeline's
    `storage_options` first, then the environment.
    """
    import obstore.store

    merged = delta_options(uri, options) or {}
    config = {k: v for k, v in merged.items() if k in _S3_KEYS and k != "AWS_ALLOW_HTTP"}
    allow_http = merged.get("AWS_ALLOW_HTTP", "").strip().lower() in ("true", "1", "yes")
    bucket, _, key = uri[len("s3://") :].partition("/")
    # obstore accepts delta-rs's AWS_* names as config keys, but takes AWS_ALLOW_HTTP as
    # a client option.
    store = obstore.store.S3Store(
        bucket, config=cast("S3Config", config), client_options={"allow_http": allow_http}
    )
    return store, key.strip("/")


def _local(uri: str) -> Path:
    if "://" in uri:
        raise ValueError(
            f"{uri}: only local paths and s3:// locations are supported; use one of those"
        )
    return Path(uri)


def _store_error(uri: str, action: str, exc: Exception) -> StorageError:
    # The first line carries the HTTP status and the object's URL; never the credentials.
    cause = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return StorageError(
        f"{uri}: could not {action}: {cause}. Check storage_options (endpoint, region, "
        "credentials) and that the store is reachable, then try again."
    )


def put_if_absent(uri: str, options: dict[str, str], data: bytes) -> bool:
    """Create an object or file only if nothing is there yet, whole or not at all.

    On S3 this is a PUT with `If-None-Match: *` (the conditional put delta-rs's commits
    rely on too). Locally the data is written to a temporary file in the same
    directory and hard-linked to the final name, which the kernel refuses if the name
    exists; readers never see a partial file.

    A request the client retried after its first attempt landed reports the object as
    already there; callers that must tell their own write from another's compare the
    content.

    Args:
        uri: A local path or an s3:// URI of the object.
        options: The pipeline's `storage_options`.
        data: The content.

    Returns:
        True if this call created it, False if something was already there.

    Raises:
        StorageError: If the store could not be reached or refused the request.
    """
    if uri.startswith("s3://"):
        import obstore
        from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError

        store, key = _object_store(uri, options)
        try:
            obstore.put(store, key, data, mode="create", use_multipart=False)
        except (AlreadyExistsError, PreconditionError):
            return False
        except BaseError as exc:
            raise _store_error(uri, "create the object", exc) from exc
        return True
    path = _local(uri)
    if path.exists():
        # Already there: no need to write and sync a copy only to be refused the name.
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            os.write(fd, data)
            # On disk before the name appears, so a power cut cannot leave an empty file.
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except (PermissionError, NotImplementedError) as exc:
            raise StorageError(
                f"{path}: the filesystem cannot hard-link files ({exc}), which creating a "
                "file only if it is absent needs; put this location on a local disk or on S3"
            ) from exc
        return True
    finally:
        tmp.unlink(missing_ok=True)


def list_names(uri: str, options: dict[str, str]) -> list[str]:
    """Names of the objects or files directly under a folder, sorted; none if it is absent.

    Temporary files of `put_if_absent` (dot-files) are left out.

    Args:
        uri: A local directory or an s3:// prefix.
        options: The pipeline's `storage_options`.

    Returns:
        The names, without the folder.

    Raises:
        StorageError: If the store could not be reached or refused the request.
    """
    if uri.startswith("s3://"):
        import obstore
        from obstore.exceptions import BaseError

        store, key = _object_store(uri, options)
        try:
            listed = obstore.list_with_delimiter(store, key or None)
        except BaseError as exc:
            raise _store_error(uri, "list the folder", exc) from exc
        names = [meta["path"].rsplit("/", 1)[-1] for meta in listed["objects"]]
    else:
        try:
            names = [e.name for e in os.scandir(_local(uri)) if e.is_file()]
        except FileNotFoundError:
            return []
    return sorted(n for n in names if not n.startswith("."))


def read_object(uri: str, options: dict[str, str]) -> bytes | None:
    """The content of an object or file, or None if it does not exist.

    Args:
        uri: A local path or an s3:// URI.
        options: The pipeline's `storage_options`.

    Returns:
        The bytes, or None.

    Raises:
        StorageError: If the store could not be reached or refused the request.
    """
    if uri.startswith("s3://"):
        import obstore
        from obstore.exceptions import BaseError

        store, key = _object_store(uri, options)
        try:
            return bytes(obstore.get(store, key).bytes())
        except FileNotFoundError:
            return None
        except BaseError as exc:
            raise _store_error(uri, "read the object", exc) from exc
    try:
        return _local(uri).read_bytes()
    except FileNotFoundError:
        return None


def delete_object(uri: str, options: dict[str, str]) -> None:
    """Delete an object or file; one that is already gone is fine.

    Args:
        uri: A local path or an s3:// URI.
        options: The pipeline's `storage_options`.

    Raises:
        StorageError: If the store could not be reached or refused the request.
    """
    if uri.startswith("s3://"):
        import obstore
        from obstore.exceptions import BaseError

        store, key = _object_store(uri, options)
        try:
            obstore.delete(store, key)
        except FileNotFoundError:
            return
        except BaseError as exc:
            raise _store_error(uri, "delete the object", exc) from exc
        return
    _local(uri).unlink(missing_ok=True)
