"""Settings of files and vector stores (``gateway/vector_stores/``).

A mixin of :class:`gateway.config.GatewaySettings` (same ``LLMESH_GATEWAY_*``
environment names and YAML section), as :mod:`gateway.resilience` is.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

MIB = 1024 * 1024


class VectorStoreSettings(BaseModel):
    """Bounds of uploads and per-tenant storage, and how ingestion runs."""

    # Largest file POST /v1/files accepts (413 past it); the HTTP body limit for that route
    # is this plus room for the multipart framing.
    files_max_bytes: int = Field(default=16 * MIB, ge=1)
    # Every tenant's files together (their bytes plus the text extracted from PDF and HTML),
    # and how many files a tenant may keep; an upload past either is a 429.
    files_tenant_quota_bytes: int = Field(default=256 * MIB, ge=1)
    files_tenant_max_files: int = Field(default=1000, ge=1)
    # Text extracted from one file (characters), and pages read from one PDF; a file past
    # either is refused at upload (400).
    files_max_text_chars: int = Field(default=2_000_000, ge=1)
    files_max_pdf_pages: int = Field(default=2000, ge=1)

    # Vector stores a tenant may keep, and files attached to one store.
    vector_stores_tenant_max: int = Field(default=100, ge=1)
    vector_stores_max_files: int = Field(default=1000, ge=1)
    # Ingestion jobs (chunk + embed one attached file) running at once on this gateway, and
    # waiting for a turn; an attach past the queue is a 429.
    ingest_concurrency: int = Field(default=4, ge=1)
    ingest_max_queued: int = Field(default=1000, ge=1)
    # A job holds a lease in Redis that its gateway renews every third of this; a job whose
    # lease ran out (its gateway died) is marked failed, "ingestion interrupted", by the next
    # gateway that reads the store, and what it wrote is deleted.
    ingest_lease_s: float = Field(default=30.0, gt=0.0)
    # One job's time from its turn to its outcome; past it the job fails (server_error) and
    # what it wrote is deleted.
    ingest_timeout_s: float = Field(default=900.0, gt=0.0)
    # Characters of one document sent to the embeddings service (a file's text is cut into
    # documents of at most this, at paragraph boundaries), and of one UpsertDocuments call.
    # Keep part_chars at most the service's LLMESH_EMBEDDINGS_MAX_DOCUMENT_CHARS (1,000,000)
    # and call_chars under its gRPC message limit (16 MiB of UTF-8).
    ingest_part_chars: int = Field(default=500_000, ge=1000)
    ingest_call_chars: int = Field(default=2_000_000, ge=1000)
    # Characters of one CheckInput call on ingested text, its documents together (the policy
    # service's LLMESH_POLICY_MAX_TEXT_CHARS is 1,000,000).
    ingest_policy_chars: int = Field(default=500_000, ge=1000)
