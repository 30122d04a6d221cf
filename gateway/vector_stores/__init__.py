"""Files and vector stores kept for tenants, over the embeddings service's collections.

``library.py`` is the entry point (one :class:`~gateway.vector_stores.library.Library` per
gateway); ``files.py`` and ``stores.py`` keep the records in Redis, ``ingest.py`` runs the
background jobs, ``extract.py`` reads uploads, ``documents.py`` maps files to documents,
``collections.py`` and ``policy.py`` are the embeddings and policy services as used here.
The HTTP routes are in ``gateway/api/files/`` and ``gateway/api/vector_stores/``.
"""
