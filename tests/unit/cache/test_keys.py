"""Response keys: normalization, what changes the key, cacheability, semantic partitions."""

from __future__ import annotations

from cache.domain import ResponseKey, Turn
from cache.keys import RedisKeys, exact_digest, is_cacheable, semantic_key


def _key(*turns: Turn, **kw: object) -> ResponseKey:
    sampling = kw.pop("sampling", {"temperature": 0.0, "max_tokens": 10})
    return ResponseKey(model="m", messages=turns, sampling=sampling, **kw)  # type: ignore[arg-type]


def test_equivalent_text_same_digest_and_tenant_separates() -> None:
    a = _key(Turn("user", "hello  world"))
    b = _key(Turn("user", "  hello  world\r\n"))
    assert exact_digest("t", a) == exact_digest("t", b)
    assert exact_digest("t", a) != exact_digest("u", a)
    assert exact_digest("t", a) != exact_digest("t", _key(Turn("user", "hello world")))


def test_output_changing_parameters_change_the_digest_others_do_not() -> None:
    base = _key(Turn("user", "x"))
    assert exact_digest("t", base) != exact_digest(
        "t", _key(Turn("user", "x"), sampling={"temperature": 0.0})
    )
    greedy_top_p = _key(Turn("user", "x"), sampling={"temperature": 0.0, "max_tokens": 10, "top_p": 0.5})
    assert exact_digest("t", base) == exact_digest("t", greedy_top_p)
    scheduled = _key(Turn("user", "x"), sampling={"temperature": 0.0, "max_tokens": 10, "priority": 3})
    assert exact_digest("t", base) == exact_digest("t", scheduled)
    assert exact_digest("t", base) != exact_digest("t", _key(Turn("user", "x"), scope="rag:kb"))
    assert exact_digest("t", base) != exact_digest("t", _key(Turn("user", "x"), tools="abc"))


def test_cacheable_only_when_deterministic() -> None:
    assert is_cacheable(_key(sampling={"temperature": 0.0}))
    assert is_cacheable(_key(sampling={"temperature": 0.7, "seed": 1}))
    assert not is_cacheable(_key(sampling={"temperature": 0.7}))
    assert not is_cacheable(_key(sampling={}))


def test_semantic_partition_is_the_exact_context() -> None:
    one = semantic_key("t", _key(Turn("system", "s"), Turn("user", "What is X?")))
    two = semantic_key("t", _key(Turn("system", "s"), Turn("user", "Tell me what X is")))
    other = semantic_key("t", _key(Turn("system", "different"), Turn("user", "What is X?")))
    assert one is not None and two is not None and other is not None
    assert one.partition == two.partition
    assert one.partition != other.partition
    assert one.query == "What is X?"
    assert semantic_key("t", _key(Turn("user", "q"), Turn("assistant", "a"))) is None


def test_redis_keys_share_one_hash_tag() -> None:
    keys = RedisKeys.of("t", _key(Turn("user", "x")))
    tag = keys.entry[keys.entry.index("{") :]
    assert keys.lease.endswith(tag)
