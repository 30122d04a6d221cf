"""Keyword and topic rules (policy/detectors/lexical.py): whole words in spaced scripts, and
inside runs of Chinese, Japanese, Korean or Thai characters, which write no spaces."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from policy.detectors.base import MESSAGE
from policy.detectors.lexical import KeywordDetector, TopicDetector
from policy.rules import parse_ruleset
from policy.stream import StreamModerator


def found(options: Mapping[str, object], text: str) -> list[str]:
    return [m.value for m in KeywordDetector(options).scan(text, MESSAGE)]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("这是机密文件", ["机密"]),
        ("机密", ["机密"]),
        ("我用iPhone拍照", ["iPhone"]),
        ("iPhones and iPhone", ["iPhone"]),
        ("an iPhone-case", ["iPhone"]),
        ("XiPhone", []),
        ("社外秘の資料です", ["社外秘"]),
        ("폭탄을 만드는 법", ["폭탄"]),
        ("วิธีทำระเบิดที่บ้าน", ["ระเบิด"]),
        ("Project  Falcon", ["Project  Falcon"]),
        ("Project Falconer", []),
    ],
)
def test_whole_words_in_spaced_scripts_and_inside_cjk_runs(text: str, words: list[str]) -> None:
    keywords = {"keywords": ["机密", "iPhone", "社外秘", "폭탄", "ระเบิด", "Project Falcon"]}
    assert found(keywords, text) == words


def test_without_whole_word_any_substring_matches_as_before() -> None:
    assert found({"keywords": ["phone"], "whole_word": False}, "XiPhone") == ["Phone"]


def test_a_topic_named_in_chinese_is_found_in_a_question() -> None:
    topics = TopicDetector({"topics": {"explosives": ["制造炸弹", "build a pipe bomb"]}})
    hits = topics.scan("请问如何制造炸弹?", MESSAGE)
    assert [(m.entity_type, m.value) for m in hits] == [("TOPIC_EXPLOSIVES", "制造炸弹")]
    assert topics.scan("如何制造蛋糕?", MESSAGE) == []


def test_a_stream_never_releases_the_start_of_a_cjk_keyword() -> None:
    ruleset = parse_ruleset(
        b"version: k\nrules:\n  - id: w\n    detector: keyword\n    scope: output\n    action: redact\n"
        b"    options: {keywords: [\xe6\x9c\xba\xe5\xaf\x86\xe6\x96\x87\xe4\xbb\xb6]}\n",  # 机密文件
        "k",
    ).for_tenant("t")
    moderator = StreamModerator(ruleset)
    released = [moderator.feed(piece).text for piece in ["这是", "机", "密", "文", "件的内容。"]]
    released.append(moderator.finish().text)
    # "机", "机密", "机密文" may still become the keyword: none of it goes out before it is known.
    assert released[2:4] == ["", ""] and not any("机" in r for r in released)
    assert "".join(released) == "这是<KEYWORD_1>的内容。"
