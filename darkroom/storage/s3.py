"""The S3 store (`s3://bucket/prefix`): boto3 against AWS or any S3-compatible endpoint.

Bucket versioning must be Enabled: darkroom records exact version ids and never relies on
"the latest" object, so an unversioned bucket would let an overwrite or a delete change
what a confirmed card points at. `check()` refuses to start otherwise, and `put()` refuses
to return without a version id.

Every boto error is translated here into darkroom's own storage errors. Their messages
are fixed, short phrases; boto's text, URLs and endpoints go to the log only.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)

from darkroom.config import STORAGE_TIMEOUT_SECONDS
from darkroom.errors import (
    ObjectMissing,
    StorageConfigError,
    StorageError,
    StorageUnavailable,
)
from darkroom.storage.base import (
    CHUNK_SIZE,
    Body,
    ObjectInfo,
    ObjectVersion,
    PresignedRequest,
    validate_content_type,
    validate_expires,
    validate_key,
    validate_prefix,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

log = logging.getLogger(__name__)

DEFAULT_CONTENT_TYPE = "application/octet-stream"
# A connection to the store is given this long at most (less when the timeout is shorter).
CONNECT_TIMEOUT_SECONDS = 5.0
# Non-seekable bodies are spooled (in memory up to this size, then on disk) because SigV4
# and retries both need to read the body more than once.
_SPOOL_MEMORY = 8 * 1024 * 1024
_DELETE_BATCH = 1000

_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchVersion", "NotFound", "404"})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "PriorRequestNotComplete",
        "OperationAborted",
    }
)
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "AllAccessDisabled",
        "AccountProblem",
        "403",
        "401",
    }
)


def make_client(
    *,
    endpoint_url: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout: float = STORAGE_TIMEOUT_SECONDS,
    max_attempts: int = 2,
) -> S3Client:
    """An S3 client configured as darkroom needs it.

    Anything not given comes from the standard AWS environment (`AWS_ENDPOINT_URL`,
    `AWS_ACCESS_KEY_ID`, ...). A custom endpoint gets path-style addressing, because
    S3-compatible servers rarely have a DNS name for every bucket. `max_attempts` counts
    every attempt, the first included: the queue retries whole jobs with backoff anyway,
    so one quick retry here is enough and keeps a stalled store from holding a worker.
    """
    endpoint_url = (
        endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path"} if endpoint_url else None,
        # botocore's own "max_attempts" counts retries only; the total is what we mean.
        retries={"total_max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    session = boto3.session.Session()
    client: S3Client = session.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        # SigV4 needs some region; S3-compatible servers accept us-east-1.
        region_name=region or "us-east-1",
        config=config,
    )
    return client


def _normalise_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    if not prefix:
        return ""
    try:
        validate_key(prefix)
    except ValueError:
        raise StorageConfigError("the S3 key prefix in the storage URL is invalid") from None
    return prefix + "/"


class S3Store:
    """Versioned objects in an S3 bucket, every key under `prefix`."""

    inline_head = False  # a HEAD request over the network

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: S3Client | None = None,
        page_size: int = 1000,
        timeout: float = STORAGE_TIMEOUT_SECONDS,
    ) -> None:
        if not bucket:
            raise StorageConfigError("the S3 bucket name is empty")
        self.bucket = bucket
        self.page_size = page_size
        self.prefix = _normalise_prefix(prefix)
        self._client = client if client is not None else make_client(
            connect_timeout=min(CONNECT_TIMEOUT_SECONDS, timeout), read_timeout=timeout)

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, prefix={self.prefix!r})"

    def _full(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _fail(
        self, exc: Exception, op: str, key: str | None = None, version: str | None = None
    ) -> NoReturn:
        """Raise the darkroom error for a boto error; the boto detail goes to the log."""
        versioned = version is not None
        where = f"s3 {op} bucket={self.bucket} key={key} version={version}"
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            missing = code in _MISSING_CODES or (status == 404 and code != "NoSuchBucket")
            # Keys are validated before any request, so a 400 on a request naming a version
            # is about the version id, and a malformed version id names no version.
            missing |= versioned and (
                code in ("InvalidArgument", "InvalidRequest") or status == 400
            )
            # A missing version is routine (deletes, sweeps); anything else deserves notice.
            log.log(
                logging.DEBUG if missing else logging.WARNING,
                "%s failed: code=%s status=%s %s",
                where,
                code,
                status,
                exc,
            )
            if missing and op != "check":
                raise ObjectMissing("object version not found") from exc
            if code == "NoSuchBucket" or (missing and op == "check"):
                raise StorageConfigError(f"bucket '{self.bucket}' does not exist") from exc
            if code in _TRANSIENT_CODES or status >= 500 or status in (408, 429):
                raise StorageUnavailable("the object store is unavailable") from exc
            if code in _DENIED_CODES or status in (401, 403):
                raise StorageConfigError(
                    f"access to bucket '{self.bucket}' was denied; check the AWS credentials"
                ) from exc
            raise StorageError(f"the object store refused the {op} request") from exc
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            log.error("%s failed: %s", where, exc)
            raise StorageConfigError(
                "no AWS credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            ) from exc
        if isinstance(exc, ConnectionError | HTTPClientError | IncompleteReadError):
            # Refused, reset, timed out (connect or read) or cut off mid-body.
            log.warning("%s failed: %s: %s", where, type(exc).__name__, exc)
            raise StorageUnavailable("the object store is unavailable") from exc
        if isinstance(exc, BotoCoreError):
            log.warning("%s failed: %s: %s", where, type(exc).__name__, exc)
            raise StorageUnavailable("the object store is unavailable") from exc
        raise exc

    # -- writing ----------------------------------------------------------------------

    def put(self, key: str, body: Body, *, content_type: str = DEFAULT_CONTENT_TYPE) -> str:
        full = self._full(key)
        validate_content_type(content_type)
        if isinstance(body, bytes | bytearray | memoryview):
            return self._put(key, full, bytes(body), content_type)
        if _seekable(body):
            return self._put(key, full, body, content_type)
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY) as spool:
            while chunk := body.read(CHUNK_SIZE):
                spool.write(chunk)
            spool.seek(0)
            return self._put(key, full, spool, content_type)

    def _put(self, key: str, full: str, body: Any, content_type: str) -> str:
        try:
            answer = self._client.put_object(
                Bucket=self.bucket, Key=full, Body=body, ContentType=content_type
            )
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "put", key)
        version = answer.get("VersionId")
        if not version or version == "null":
            log.error("s3 put to bucket %s returned no version id", self.bucket)
            raise StorageConfigError(
                f"bucket '{self.bucket}' returned no version id; darkroom needs versioning Enabled"
            )
        return version

    def delete(self, key: str, version: str | None = None) -> None:
        full = self._full(key)
        if version is not None:
            if not version:
                return
            try:
                self._client.delete_object(Bucket=self.bucket, Key=full, VersionId=version)
            except (BotoCoreError, ClientError) as exc:
                try:
                    self._fail(exc, "delete", key, version)
                except ObjectMissing:
                    return
            return
        # Deleting by version id removes data for good; a plain DeleteObject would only
        # add a delete marker and keep every byte.
        targets: list[ObjectIdentifierTypeDef] = [
            {"Key": full, "VersionId": v}
            for v in self._versions_of(full, key, include_markers=True)
        ]
        for start in range(0, len(targets), _DELETE_BATCH):
            batch = targets[start : start + _DELETE_BATCH]
            try:
                answer = self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": batch, "Quiet": True},
                )
            except (BotoCoreError, ClientError) as exc:
                self._fail(exc, "delete", key)
            errors = [e for e in answer.get("Errors", []) if e.get("Code") not in _MISSING_CODES]
            if errors:
                log.warning("s3 delete of %s: %d versions failed: %s", key, len(errors), errors)
                raise StorageUnavailable("the object store did not delete every version")

    def _versions_of(self, full: str, key: str, *, include_markers: bool) -> list[str]:
        versions: list[str] = []
        try:
            pages = self._client.get_paginator("list_object_versions").paginate(
                Bucket=self.bucket, Prefix=full, PaginationConfig={"PageSize": self.page_size}
            )
            for page in pages:
                entries: list[Any] = list(page.get("Versions", []))
                if include_markers:
                    entries += page.get("DeleteMarkers", [])
                # The listing is by prefix: "a/b" also lists "a/bc" and "a/b/c".
                versions += [e["VersionId"] for e in entries if e.get("Key") == full]
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "list", key)
        return versions

    # -- reading ----------------------------------------------------------------------

    def get(self, key: str, version: str) -> bytes:
        full = self._full(key)
        if not version:
            raise ObjectMissing("object version not found")
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=full, VersionId=version)
            # Reading the body is inside the try: a stall or reset mid-body is transient too.
            with answer["Body"] as stream:
                data: bytes = stream.read()
                return data
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "get", key, version)

    def head(self, key: str, version: str) -> ObjectInfo:
        full = self._full(key)
        if not version:
            raise ObjectMissing("object version not found")
        try:
            answer = self._client.head_object(Bucket=self.bucket, Key=full, VersionId=version)
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "head", key, version)
        if answer.get("DeleteMarker"):
            raise ObjectMissing("object version not found")
        return ObjectInfo(
            key=key,
            version=answer.get("VersionId") or version,
            size=int(answer.get("ContentLength", 0)),
            content_type=answer.get("ContentType") or DEFAULT_CONTENT_TYPE,
        )

    def digest(self, key: str, version: str) -> str:
        full = self._full(key)
        if not version:
            raise ObjectMissing("object version not found")
        try:
            # A full-object SHA-256 the store verified at PUT (x-amz-checksum-sha256) saves
            # reading the bytes; SeaweedFS and AWS refuse a PUT whose body does not match it.
            answer = self._client.head_object(
                Bucket=self.bucket, Key=full, VersionId=version, ChecksumMode="ENABLED")
            stored = answer.get("ChecksumSHA256")
            if stored and "-" not in stored and answer.get("ChecksumType") in (None,
                                                                               "FULL_OBJECT"):
                return base64.b64decode(stored).hex()
            body = self._client.get_object(Bucket=self.bucket, Key=full, VersionId=version)
            hasher = hashlib.sha256()
            stream = body["Body"]
            try:
                for chunk in stream.iter_chunks(CHUNK_SIZE):
                    hasher.update(chunk)
            finally:
                stream.close()
            return hasher.hexdigest()
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "get", key, version)

    def list(self, prefix: str) -> Iterator[ObjectVersion]:
        full_prefix = self.prefix + validate_prefix(prefix)
        try:
            pages = self._client.get_paginator("list_object_versions").paginate(
                Bucket=self.bucket,
                Prefix=full_prefix,
                PaginationConfig={"PageSize": self.page_size},
            )
            for page in pages:
                for entry in page.get("Versions", []):
                    full = entry.get("Key", "")
                    version = entry.get("VersionId")
                    if not full.startswith(self.prefix) or not version:
                        continue
                    yield ObjectVersion(full[len(self.prefix) :], version, int(entry["Size"]),
                                        entry.get("LastModified"))
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "list")

    # -- presigning -------------------------------------------------------------------

    def presign_put(
        self, key: str, *, content_type: str, expires: int = 900, size: int | None = None
    ) -> PresignedRequest | None:
        full = self._full(key)
        validate_content_type(content_type)
        validate_expires(expires)
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": full, "ContentType": content_type}
        if size is not None:
            if not isinstance(size, int) or size < 0:
                raise ValueError("size must be a byte count")
            # Signed like Content-Type: a body of any other length fails the signature,
            # so one URL cannot store more than the card declared.
            params["ContentLength"] = size
        try:
            url = self._client.generate_presigned_url(
                "put_object", Params=params, ExpiresIn=expires, HttpMethod="PUT",
            )
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "presign", key)
        # Content-Type (and Content-Length) are signed: the upload must send exactly these.
        # Content-Length is not listed: every client computes it, and browsers refuse to
        # let a page set it.
        return PresignedRequest("PUT", url, {"Content-Type": content_type})

    def presign_get(self, key: str, version: str, *, expires: int = 300) -> str | None:
        full = self._full(key)
        validate_expires(expires)
        if not version:
            raise ObjectMissing("object version not found")
        try:
            url: str = self._client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": full, "VersionId": version},
                ExpiresIn=expires,
            )
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "presign", key)
        return url

    # -- readiness --------------------------------------------------------------------

    def check(self) -> None:
        try:
            answer = self._client.get_bucket_versioning(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            self._fail(exc, "check")
        status = answer.get("Status")
        if status != "Enabled":
            shown = status or "not enabled"
            log.error("bucket %s versioning is %s", self.bucket, shown)
            raise StorageConfigError(
                f"bucket '{self.bucket}' versioning is {shown}; darkroom needs Enabled"
            )


def _seekable(body: Any) -> bool:
    try:
        return bool(body.seekable()) and body.tell() >= 0
    except (AttributeError, OSError, ValueError):
        return False
