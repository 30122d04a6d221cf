"""Language partitions of the semantic cache: py3langid restricted to the supported list."""

from __future__ import annotations

import pytest

from cache.language import LANGUAGES, LanguageId


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("How do I reset my password on the website?", "en"),
        ("Wie setze ich mein Passwort auf der Website zurück?", "de"),
        ("Comment réinitialiser mon mot de passe sur le site ?", "fr"),
        ("¿Cómo restablezco mi contraseña en el sitio web?", "es"),
        ("Как сбросить пароль на сайте?", "ru"),
        ("如何在网站上重置我的密码", "zh"),
    ],
)
def test_detects_the_language_of_a_prompt(text: str, language: str) -> None:
    assert LanguageId().detect(text) == language


def test_an_unsure_short_prompt_goes_to_the_default() -> None:
    ident = LanguageId(default="en", min_confidence=0.999999)
    assert ident.detect("ok") == "en"
    assert set(LANGUAGES) >= {"en", "de", "fr", "es", "zh"}
