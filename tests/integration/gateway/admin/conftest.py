"""The admin store's tests share the fresh-tenant fixture (its records are removed after)."""

from __future__ import annotations

from tests.fixtures.admin import new_tenant

__all__ = ["new_tenant"]
