"""``llmesh serve embeddings``: the EmbeddingService (the model loads before the port opens)."""

from services.embeddings.app import create
from services.embeddings.config import EmbeddingsSettings
from services.runtime.entry import main

if __name__ == "__main__":
    main(EmbeddingsSettings, create)
