"""OpenAI files wire models (``openai.types.FileObject``, ``FileDeleted``, the cursor page)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gateway.vector_stores.files import StoredFile

# OpenAI's bounds on GET /v1/files?limit=.
MAX_LIST_LIMIT = 10_000


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    # Deprecated by OpenAI but still in the schema: a stored file has been read already.
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None

    @classmethod
    def of(cls, stored: StoredFile) -> FileObject:
        return cls(
            id=stored.id,
            bytes=stored.size,
            created_at=stored.created_at,
            filename=stored.filename,
            purpose=stored.purpose,
        )


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject] = Field(default_factory=list)
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None

    @classmethod
    def of(cls, files: list[StoredFile], has_more: bool) -> FileList:
        data = [FileObject.of(f) for f in files]
        return cls(
            data=data,
            has_more=has_more,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
        )
