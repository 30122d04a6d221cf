"""EmbeddingService: embeddings, document ingestion (chunking) and vector search for RAG."""
