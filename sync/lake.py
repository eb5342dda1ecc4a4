"""Where the lake is: a local directory, or a bucket of S3 or of an S3-compatible store.

LAKESYNC_LAKE is a path (or a file: URI) or `s3a://bucket/prefix` (`s3://` is taken as
the same). Spark and Delta write the tables and the streaming checkpoints through
Hadoop's file systems (S3A for a bucket: sync/streaming/spark.py). Lakesync's own files
(the catalog's pointers, progress, fencing epochs, consistent points, held
transactions) and what it reads of Spark's and Delta's (a checkpoint's offsets, a
table's log) go through a `LakePath`: pathlib.Path for a directory, `ObjectPath` for a
bucket, with the same methods, so the code that uses them is the same for both.

What a bucket gives instead of a file system's calls:
  - A PUT is atomic: a reader gets the old object or the new one, so a small file is
    replaced whole by writing it (`replace_text`), with no rename.
  - Creating an object only if there is none is a conditional PUT (If-None-Match: *,
    in S3 since 2024-08, in MinIO and moto): fencing claims its epochs so
    (sync/delta/fencing.py), where a directory has O_EXCL.
  - A folder is a key prefix: it exists while an object is under it; mkdir does nothing.

The endpoint, region and credentials are the AWS SDK's own variables (AWS_ENDPOINT_URL,
AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, or the SDK's
other sources: its files, an instance's role), read by boto3 here and handed to S3A
(`s3a_options`). With an endpoint of its own (MinIO, moto, Ceph), a bucket is addressed
by path (http://host/bucket/key), as those stores expect.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Union
from urllib.parse import unquote, urlsplit

from sync.errors import LakesyncError, ServiceUnavailable

SCHEMES = ("s3a", "s3")  # Hadoop's name for S3 and everyone else's


@dataclass(frozen=True)
class ObjectStat:
    """What `ObjectPath.stat` tells, under os.stat_result's names. An object's modification
    time has a second's precision, so where a file's identity is its inode an object's
    is its ETag (a digest of its content), as a number."""
    st_size: int
    st_mtime_ns: int
    st_ino: int

    @classmethod
    def of(cls, size: int, modified, etag: str) -> "ObjectStat":
        return cls(size, int(modified.timestamp() * 1e9), int(hashlib.sha1(etag.encode()).hexdigest()[:15], 16))


@dataclass(frozen=True)
class ObjectPath:
    """A key (or a key prefix: a folder) in a bucket, with pathlib.Path's methods that
    Lakesync uses. `str()` is its s3a:// URI, for Spark and Delta."""
    bucket: str
    key: str = ""  # without a leading or trailing slash; "" is the bucket's root
    listed: ObjectStat | None = field(default=None, compare=False, repr=False)  # from the listing that found it

    def __str__(self) -> str:
        return f"s3a://{self.bucket}/{self.key}" if self.key else f"s3a://{self.bucket}"

    def __truediv__(self, part: str | os.PathLike) -> "ObjectPath":
        part = str(part).strip("/")
        return ObjectPath(self.bucket, f"{self.key}/{part}" if self.key else part)

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    @property
    def stem(self) -> str:
        return Path(self.name).stem

    @property
    def parent(self) -> "ObjectPath":
        return ObjectPath(self.bucket, self.key.rpartition("/")[0])

    def with_suffix(self, suffix: str) -> "ObjectPath":
        return self.parent / (self.stem + suffix)

    # -- reading ---------------------------------------------------------------------
    def is_file(self) -> bool:
        if not self.key:
            return False
        try:
            _call("head_object", Bucket=self.bucket, Key=self.key)
            return True
        except FileNotFoundError:
            return False

    def is_dir(self) -> bool:
        prefix = f"{self.key}/" if self.key else ""
        return _call("list_objects_v2", Bucket=self.bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0) > 0

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def iterdir(self) -> Iterator["ObjectPath"]:
        """The objects and the folders right under this folder (S3A's empty folder
        markers, `<folder>/`, are not entries)."""
        prefix = f"{self.key}/" if self.key else ""
        for page in _pages(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            for folder in page.get("CommonPrefixes", []):
                yield ObjectPath(self.bucket, folder["Prefix"].rstrip("/"))
            for found in page.get("Contents", []):
                if found["Key"] != prefix:
                    stat = ObjectStat.of(found["Size"], found["LastModified"], found["ETag"])
                    yield ObjectPath(self.bucket, found["Key"], listed=stat)

    def glob(self, pattern: str) -> Iterator["ObjectPath"]:
        """The entries right under this folder whose name matches `pattern` (one level)."""
        assert "/" not in pattern and "**" not in pattern, f"a one-level pattern, not {pattern!r}"
        return (entry for entry in self.iterdir() if fnmatch.fnmatchcase(entry.name, pattern))

    def stat(self) -> ObjectStat:
        if self.listed is not None:
            return self.listed
        head = _call("head_object", Bucket=self.bucket, Key=self.key)
        return ObjectStat.of(head["ContentLength"], head["LastModified"], head["ETag"])

    def read_bytes(self) -> bytes:
        return _call("get_object", Bucket=self.bucket, Key=self.key)["Body"].read()

    def read_text(self, errors: str = "strict") -> str:
        return self.read_bytes().decode("utf-8", errors)

    # -- writing ---------------------------------------------------------------------
    def write_text(self, text: str) -> None:
        _call("put_object", Bucket=self.bucket, Key=self.key, Body=text.encode())

    def touch(self, exist_ok: bool = True) -> None:
        """An empty object; with exist_ok=False, only if there is none (a conditional
        PUT), else FileExistsError, as pathlib's O_EXCL."""
        if not exist_ok:
            _call("put_object", Bucket=self.bucket, Key=self.key, Body=b"", IfNoneMatch="*")
        elif not self.is_file():
            _call("put_object", Bucket=self.bucket, Key=self.key, Body=b"")

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing: a folder is there once an object is under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        if not missing_ok and not self.is_file():
            raise FileNotFoundError(str(self))
        _call("delete_object", Bucket=self.bucket, Key=self.key)


LakePath = Union[Path, ObjectPath]


def at(location: str | LakePath) -> LakePath:
    """The LakePath of a lake's location: a path or a file: URI (a directory, resolved),
    or an s3a:// or s3:// URI (an ObjectPath). Any other URI is refused in one line."""
    if isinstance(location, (Path, ObjectPath)):
        return location
    parts = urlsplit(location)
    if parts.scheme in SCHEMES:
        if not parts.netloc:
            raise LakesyncError(f"{location}: names no bucket (write {parts.scheme}://BUCKET/PREFIX)")
        return ObjectPath(parts.netloc, unquote(parts.path).strip("/"))
    if parts.scheme == "file":
        return Path(unquote(parts.path)).resolve()
    if "://" in location:
        raise LakesyncError(f"{location}: a lake is a local directory (a path or a file: URI) or a bucket "
                            f"(s3a://BUCKET/PREFIX); a {parts.scheme}: URI is not supported")
    return Path(location).resolve()


def on_object_storage(location: str | LakePath) -> bool:
    return isinstance(at(location), ObjectPath)


def remove_tree(location: str | LakePath) -> None:
    """Remove a folder and everything under it; nothing when there is none."""
    path = at(location)
    if isinstance(path, Path):
        shutil.rmtree(path, ignore_errors=True)
        return
    for page in _pages(Bucket=path.bucket, Prefix=f"{path.key}/"):
        keys = [{"Key": found["Key"]} for found in page.get("Contents", [])]
        if keys:  # (a page holds at most the 1,000 keys one delete takes)
            _call("delete_objects", Bucket=path.bucket, Delete={"Objects": keys, "Quiet": True})


def replace_text(location: str | LakePath, text: str) -> None:
    """Replace a small file whole; a reader sees the old content or the new, never part.
    A directory: a temporary file beside it renamed over it (atomic on POSIX). A bucket:
    one PUT (atomic)."""
    path = at(location)
    if isinstance(path, ObjectPath):
        path.write_text(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def reader_uri(location: str | LakePath) -> str:
    """The location as readers outside Hadoop name it (DuckDB, delta-rs: s3://)."""
    path = at(location)
    return f"s3://{path.bucket}/{path.key}" if isinstance(path, ObjectPath) else str(path)


# -- the client ----------------------------------------------------------------------
@dataclass(frozen=True)
class Store:
    """The S3 endpoint and region the SDK's variables name (None: AWS's own)."""
    endpoint: str | None
    region: str

    @property
    def path_style(self) -> bool:
        return self.endpoint is not None


def store() -> Store:
    return Store(endpoint=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None,
                 region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")


def credentials() -> dict[str, str]:
    """The access key the SDK finds (its variables, files or an instance's role); empty
    when it finds none."""
    import boto3

    found = boto3.session.Session().get_credentials()
    if found is None:
        return {}
    frozen = found.get_frozen_credentials()
    return {"access_key": frozen.access_key, "secret_key": frozen.secret_key,
            **({"session_token": frozen.token} if frozen.token else {})}


def s3a_options() -> dict[str, str]:
    """Hadoop's S3A settings for the store (spark.hadoop.fs.s3a.*): the endpoint, region
    and addressing, and the credentials, so that executors on other machines, which do
    not have the driver's variables, have them (Spark redacts keys and secrets in its
    logs and UI)."""
    current = store()
    options = {"fs.s3a.endpoint.region": current.region,
               "fs.s3a.path.style.access": str(current.path_style).lower()}
    if current.endpoint:
        options["fs.s3a.endpoint"] = current.endpoint
        options["fs.s3a.connection.ssl.enabled"] = str(current.endpoint.startswith("https")).lower()
    found = credentials()
    if found:
        options.update({"fs.s3a.access.key": found["access_key"], "fs.s3a.secret.key": found["secret_key"]})
        if "session_token" in found:
            options["fs.s3a.session.token"] = found["session_token"]
            options["fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")
    return options


def reader_options() -> dict[str, str]:
    """delta-rs' storage options for the store (AWS_* keys, as its object store names them)."""
    current = store()
    options = {"AWS_REGION": current.region}
    if current.endpoint:
        options.update({"AWS_ENDPOINT_URL": current.endpoint, "AWS_FORCE_PATH_STYLE": "true",
                        "AWS_ALLOW_HTTP": str(current.endpoint.startswith("http://")).lower()})
    found = credentials()
    if found:
        options.update({"AWS_ACCESS_KEY_ID": found["access_key"], "AWS_SECRET_ACCESS_KEY": found["secret_key"],
                        **({"AWS_SESSION_TOKEN": found["session_token"]} if "session_token" in found else {})})
    return options


_clients: dict[Store, object] = {}
_clients_lock = threading.Lock()


def _client():
    """One boto3 S3 client per store (a client is safe to share between threads)."""
    current = store()
    with _clients_lock:
        if current not in _clients:
            import boto3
            from botocore.config import Config

            _clients[current] = boto3.client(
                "s3", endpoint_url=current.endpoint, region_name=current.region,
                config=Config(s3={"addressing_style": "path" if current.path_style else "auto"},
                              retries={"max_attempts": 5, "mode": "standard"}))
        return _clients[current]


def _call(operation: str, **params):
    """One S3 request. A key that is not there: FileNotFoundError; a conditional PUT of
    one that is (412), or whose twin is under way (409): FileExistsError; anything else
    (no such bucket, refused, unreachable): ServiceUnavailable, in one line."""
    from botocore.exceptions import BotoCoreError, ClientError

    where = f"s3a://{params.get('Bucket')}/{params.get('Key', params.get('Prefix', ''))}"
    try:
        return getattr(_client(), operation)(**params)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404 and code != "NoSuchBucket":
            raise FileNotFoundError(where) from None
        if status in (409, 412) and "IfNoneMatch" in params:
            raise FileExistsError(where) from None
        message = error.response.get("Error", {}).get("Message") or code or status
        raise ServiceUnavailable(f"the lake's store refused {operation} of {where}: {message}") from None
    except BotoCoreError as error:
        raise ServiceUnavailable(f"the lake's store cannot be reached ({operation} of {where}): {error}") from None


def _pages(**params) -> Iterator[dict]:
    """list_objects_v2's pages, one request each."""
    while True:
        page = _call("list_objects_v2", **params)
        yield page
        if not page.get("IsTruncated"):
            return
        params["ContinuationToken"] = page["NextContinuationToken"]
