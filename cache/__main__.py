"""``llmesh serve cache``: the ContextCacheService."""

from cache.app import create
from cache.config import CacheSettings
from services.runtime.entry import main

if __name__ == "__main__":
    main(CacheSettings, create)
