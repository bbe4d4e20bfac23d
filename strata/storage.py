"""Filesystems for table and state locations: local paths or s3:// URIs.

Object-store options follow delta-rs's names (`AWS_ENDPOINT_URL`, `AWS_REGION`,
`AWS_ALLOW_HTTP`, ...), so one `storage_options` mapping serves both the Parquet
writers (pyarrow) and the Delta commits (deltalake). Unset options fall back to the
process environment, where credentials belong.
"""

from __future__ import annotations

import os
import uuid

import pyarrow.fs as pafs

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
