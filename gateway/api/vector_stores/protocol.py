"""OpenAI vector store wire models (``openai.types.VectorStore``, ``vector_stores.VectorStoreFile``,
``VectorStoreSearchResponse`` and their requests), converted from the library's records."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from gateway.api.protocol import OpenAIModel
from gateway.vector_stores.collections import Chunking
from gateway.vector_stores.documents import ATTRIBUTE_PREFIX, Attribute, check_attributes, encode_value
from gateway.vector_stores.library import Found
from gateway.vector_stores.stores import FileRecord, StoreRecord
from services.runtime.errors import InvalidArgument

MAX_NAME_CHARS = 256
MAX_FILE_IDS = 500
MAX_METADATA = 16
MAX_LIST_LIMIT = 100
MAX_SEARCH_RESULTS = 50
MAX_QUERIES = 8
MAX_QUERY_CHARS = 8192
# OpenAI's bounds on a static chunking strategy (the embedding model's own limit, 254 tokens
# for all-MiniLM-L6-v2, is checked by the embeddings service: a larger chunk fails the file).
MAX_CHUNK_TOKENS = 4096


def _is_text(value: object) -> bool:
    """A non-empty string that is valid Unicode (JSON can carry lone surrogates; gRPC cannot)."""
    if not isinstance(value, str) or not value or len(value) > 256:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > MAX_METADATA:
        raise ValueError(f"at most {MAX_METADATA} pairs")
    for key, item in value.items():
        if not key or len(key) > 64 or len(item) > 512:
            raise ValueError("keys are 1-64 characters, values at most 512")
    return value


class StaticChunking(OpenAIModel):
    max_chunk_size_tokens: int = Field(ge=1, le=MAX_CHUNK_TOKENS)
    chunk_overlap_tokens: int = Field(ge=0)

    @model_validator(mode="after")
    def _overlap(self) -> StaticChunking:
        if self.chunk_overlap_tokens >= self.max_chunk_size_tokens:
            raise ValueError("chunk_overlap_tokens must be below max_chunk_size_tokens")
        return self


class ChunkingStrategy(OpenAIModel):
    """``{"type": "auto"}`` (the embeddings service's chunking) or ``{"type": "static", ...}``."""

    type: Literal["auto", "static"]
    static: StaticChunking | None = None

    @model_validator(mode="after")
    def _static(self) -> ChunkingStrategy:
        if self.type == "static" and self.static is None:
            raise ValueError("a static chunking strategy needs 'static'")
        return self

    def to_chunking(self) -> Chunking | None:
        if self.type != "static" or self.static is None:
            return None
        return Chunking(self.static.max_chunk_size_tokens, self.static.chunk_overlap_tokens)


def _no_expiry(value: object) -> object:
    if value is not None:
        raise ValueError("not supported: vector stores are kept until deleted")
    return value


class CreateVectorStoreRequest(OpenAIModel):
    """``POST /v1/vector_stores``."""

    name: str = Field(default="", max_length=MAX_NAME_CHARS)
    file_ids: list[str] = Field(default_factory=list, max_length=MAX_FILE_IDS)
    metadata: dict[str, str] | None = None
    chunking_strategy: ChunkingStrategy | None = None
    expires_after: dict[str, Any] | None = None
    description: str | None = Field(default=None, max_length=512)

    _metadata = field_validator("metadata")(_check_metadata)
    _expires = field_validator("expires_after")(_no_expiry)


class UpdateVectorStoreRequest(OpenAIModel):
    """``POST /v1/vector_stores/{id}``."""

    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    metadata: dict[str, str] | None = None
    expires_after: dict[str, Any] | None = None

    _metadata = field_validator("metadata")(_check_metadata)
    _expires = field_validator("expires_after")(_no_expiry)


class CreateVectorStoreFileRequest(OpenAIModel):
    """``POST /v1/vector_stores/{id}/files``."""

    file_id: str = Field(min_length=1, max_length=128)
    attributes: dict[str, str | bool | float] | None = None
    chunking_strategy: ChunkingStrategy | None = None

    def checked_attributes(self) -> dict[str, Attribute]:
        return check_attributes(self.attributes)


class RankingOptions(OpenAIModel):
    ranker: Literal["none", "auto", "default-2024-11-15"] = "auto"
    score_threshold: float = Field(default=0.0, ge=0.0, le=1.0)


class SearchRequest(OpenAIModel):
    """``POST /v1/vector_stores/{id}/search``."""

    query: str | list[str]
    max_num_results: int = Field(default=10, ge=1, le=MAX_SEARCH_RESULTS)
    ranking_options: RankingOptions | None = None
    filters: dict[str, Any] | None = None
    rewrite_query: bool = False

    @model_validator(mode="after")
    def _check(self) -> SearchRequest:
        queries = self.queries()
        if not queries or len(queries) > MAX_QUERIES:
            raise ValueError(f"query must be a string or 1 to {MAX_QUERIES} strings")
        if any(not q.strip() or len(q) > MAX_QUERY_CHARS for q in queries):
            raise ValueError(f"query strings must not be blank nor longer than {MAX_QUERY_CHARS} characters")
        if self.rewrite_query:
            raise ValueError("rewrite_query is not supported (the query is searched as written)")
        return self

    def queries(self) -> list[str]:
        return [self.query] if isinstance(self.query, str) else list(self.query)

    def metadata_filters(self) -> dict[str, str] | None:
        """The filters as exact metadata matches; None when they can match nothing (the same
        key required to equal two values)."""
        wanted: dict[str, str] = {}
        possible = True

        def walk(node: object, where: str) -> None:
            nonlocal possible
            if not isinstance(node, dict):
                raise InvalidArgument(f"{where}: a filter is an object")
            kind = node.get("type")
            if kind == "and":
                children = node.get("filters")
                if not isinstance(children, list) or not children:
                    raise InvalidArgument(f"{where}.filters: a non-empty list of filters")
                for i, child in enumerate(children):
                    walk(child, f"{where}.filters[{i}]")
                return
            if kind != "eq":
                raise InvalidArgument(
                    f"{where}.type: {kind!r} is not supported; filters are 'eq' comparisons "
                    "combined with 'and' (attributes matched exactly)"
                )
            key, value = node.get("key"), node.get("value")
            if (
                not isinstance(key, str)
                or not _is_text(key)
                or not isinstance(value, str | bool | int | float)
            ):
                raise InvalidArgument(
                    f"{where}: an eq filter has a 'key' and a string, number or boolean 'value'"
                )
            encoded = encode_value(value)
            name = ATTRIBUTE_PREFIX + key
            if wanted.get(name, encoded) != encoded:
                possible = False
            wanted[name] = encoded

        if self.filters:
            walk(self.filters, "filters")
        return wanted if possible else None


class FileCounts(BaseModel):
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    total: int = 0


class VectorStoreObject(BaseModel):
    id: str
    object: Literal["vector_store"] = "vector_store"
    created_at: int
    name: str
    usage_bytes: int
    file_counts: FileCounts
    status: Literal["expired", "in_progress", "completed"]
    last_active_at: int | None = None
    metadata: dict[str, str] | None = None
    expires_after: None = None
    expires_at: None = None

    @classmethod
    def of(cls, store: StoreRecord) -> VectorStoreObject:
        counts = FileCounts(**store.counts)
        return cls(
            id=store.id,
            created_at=store.created_at,
            name=store.name,
            usage_bytes=store.usage_bytes,
            file_counts=counts,
            status="in_progress" if counts.in_progress else "completed",
            last_active_at=store.last_active_at,
            metadata=store.metadata,
        )


class VectorStoreDeleted(BaseModel):
    id: str
    object: Literal["vector_store.deleted"] = "vector_store.deleted"
    deleted: bool = True


class LastError(BaseModel):
    code: Literal["server_error", "unsupported_file", "invalid_file"]
    message: str


class VectorStoreFileObject(BaseModel):
    id: str
    object: Literal["vector_store.file"] = "vector_store.file"
    created_at: int
    vector_store_id: str
    status: Literal["in_progress", "completed", "cancelled", "failed"]
    usage_bytes: int
    last_error: LastError | None = None
    attributes: dict[str, Attribute] | None = None
    chunking_strategy: dict[str, Any] | None = None

    @classmethod
    def of(cls, record: FileRecord) -> VectorStoreFileObject:
        error = None
        if record.status == "failed":
            code = (
                record.error_code
                if record.error_code in ("unsupported_file", "invalid_file")
                else "server_error"
            )
            error = LastError(code=code, message=record.error_message or "ingestion failed")  # type: ignore[arg-type]
        chunking = None if record.chunking is None else {"type": "static", "static": record.chunking}
        return cls(
            id=record.id,
            created_at=record.created_at,
            vector_store_id=record.store_id,
            status=record.status,
            usage_bytes=record.usage_bytes,
            last_error=error,
            attributes=record.attributes or None,
            chunking_strategy=chunking,
        )


class VectorStoreFileDeleted(BaseModel):
    id: str
    object: Literal["vector_store.file.deleted"] = "vector_store.file.deleted"
    deleted: bool = True


class CursorPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[Any] = Field(default_factory=list)
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None

    @classmethod
    def of(cls, items: list[VectorStoreObject] | list[VectorStoreFileObject], has_more: bool) -> CursorPage:
        return cls(
            data=[i.model_dump() for i in items],
            has_more=has_more,
            first_id=items[0].id if items else None,
            last_id=items[-1].id if items else None,
        )


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class SearchResult(BaseModel):
    file_id: str
    filename: str
    score: float
    attributes: dict[str, Attribute] | None = None
    content: list[TextContent]

    @classmethod
    def of(cls, found: Found) -> SearchResult:
        return cls(
            file_id=found.file_id,
            filename=found.filename,
            score=found.score,
            attributes=found.attributes or None,
            content=[TextContent(text=found.text)],
        )


class SearchPage(BaseModel):
    object: Literal["vector_store.search_results.page"] = "vector_store.search_results.page"
    search_query: list[str]
    data: list[SearchResult] = Field(default_factory=list)
    has_more: bool = False
    next_page: str | None = None


class FileContentPage(BaseModel):
    object: Literal["vector_store.file_content.page"] = "vector_store.file_content.page"
    data: list[TextContent] = Field(default_factory=list)
    has_more: bool = False
    next_page: str | None = None
