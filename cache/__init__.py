"""ContextCacheService: sessions, exact + semantic response cache and versions on Redis."""
