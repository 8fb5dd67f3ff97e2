"""The data files a job left behind: finding them (writers), and deleting the ones that will never be
committed (writers and committers both: it lives here, beside the tables, so no role imports another).

Files are reached through the table's FileIO (pyiceberg's, configured by the catalog's properties:
`s3.endpoint`, `s3.access-key-id`, ...), so an object store needs no other settings. `spark_filesystem`
hands the same file system to a Spark job for the storage Spark cannot reach itself
(spark_jobs/files.py).
"""

from __future__ import annotations

import logging

from pyarrow import fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import PyArrowFileIO

log = logging.getLogger(__name__)

# What Spark's own Parquet reader and writer reach with the Hadoop libraries the pyspark package
# carries; any other scheme goes through pyarrow on the executors.
SPARK_SCHEMES = frozenset({"file", "hdfs", "viewfs"})


def catalog_io(catalog: Catalog) -> FileIO:
    """The catalog's FileIO, for files of any of its tables (a table's own `io` may add
    table-level properties, such as credentials a REST catalog vends)."""
    io = _catalog_ios.get(id(catalog))
    if io is None:
        io = _catalog_ios[id(catalog)] = load_file_io(catalog.properties)
    return io


_catalog_ios: dict[int, FileIO] = {}


def locate(location: str, io: FileIO | None = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system holding `location` (configured by `io`'s properties), and the path in it."""
    if io is None:
        return pafs.FileSystem.from_uri(location)
    arrow_io = io if isinstance(io, PyArrowFileIO) else PyArrowFileIO(io.properties)
    scheme, netloc, path = PyArrowFileIO.parse_location(location, arrow_io.properties)
    return arrow_io.fs_by_scheme(scheme, netloc), path


def spark_filesystem(location: str, io: FileIO) -> pafs.FileSystem | None:
    """The file system a Spark job writes `location` through with pyarrow; None when Spark's own
    writer reaches it."""
    scheme = PyArrowFileIO.parse_location(location)[0]
    return None if scheme in SPARK_SCHEMES else locate(location, io)[0]


def list_data_files(directory: str, io: FileIO | None = None) -> list[str]:
    """The Parquet files a job left under `directory`, partition subdirectories included (not
    Spark's checksums or markers); none when the job wrote nothing there."""
    store, path = locate(directory, io)
    if store.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    infos = store.get_file_info(pafs.FileSelector(path, recursive=True))
    relative = sorted(info.path[len(path):].lstrip("/") for info in infos if info.is_file)
    return [f"{directory}/{name}" for name in relative if name.endswith(".parquet") and not name.rsplit("/", 1)[-1].startswith((".", "_"))]


def delete_files(paths: list[str], io: FileIO | None = None) -> None:
    for path in paths:
        try:
            store, location = locate(path, io)
            store.delete_file(location)
        except FileNotFoundError:
            pass  # gone already
        except OSError:
            log.warning("could not delete orphaned file %s", path)
