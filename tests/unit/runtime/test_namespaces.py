"""The namespace strings are on the wire and in Redis keys: they must not change."""

from __future__ import annotations

from cache.domain import ResponseKey
from cache.keys import response_namespace
from cache.sessions import session_namespace
from services.embeddings import collections
from services.runtime import namespaces


def test_strings_are_byte_identical_to_the_stored_ones() -> None:
    assert namespaces.TENANT == "tenant"
    assert namespaces.POLICY == "policy"
    assert namespaces.response_scope("") == "response:default"
    assert namespaces.response_scope("rag:a:k3:s0") == "response:rag:a:k3:s0"
    assert namespaces.session("s-1") == "session:s-1"
    assert namespaces.rag_collection("docs") == "rag:docs"


def test_rag_scope_sorts_collections_and_formats_bounds() -> None:
    assert namespaces.rag_scope(["b", "a"], 5, 0.25) == "rag:a+b:k5:s0.25"
    assert namespaces.rag_scope(["a"], 10, 0.0) == "rag:a:k10:s0"


def test_cache_owned_namespaces() -> None:
    assert namespaces.is_cache_owned("tenant")
    assert namespaces.is_cache_owned(namespaces.response_scope("x"))
    assert not namespaces.is_cache_owned(namespaces.rag_collection("docs"))
    assert not namespaces.is_cache_owned(namespaces.session("s"))
    assert not namespaces.is_cache_owned(namespaces.POLICY)


def test_services_build_their_namespaces_here() -> None:
    assert response_namespace(ResponseKey(model="m", scope="s")) == namespaces.response_scope("s")
    assert session_namespace("abc") == namespaces.session("abc")
    assert collections.namespace("docs") == namespaces.rag_collection("docs")
