"""The verifiers' linear layers in int8 with dynamic activation scales: about half the CPU.

torch's dynamic quantization gives a layer's whole input one int8 scale per call. That fits
MiniLM (``same-question-v1``: one scale per layer's weights too, as it was chosen). In
multilingual-e5-small a few input channels of most layers carry activations 5 to 60 times the
others' on every input (the feed-forward output layers' one channel after GELU above all; the
layer norms' outputs feeding the attention and the feed-forward input), so one scale for all of
them leaves the other channels a handful of steps: quantized that way the verifier's scores
moved by 0.12 on average. For it, the :data:`OUTLIER_CHANNELS` input channels of each layer
with the largest activations on a few fixed probe pairs are multiplied in float32 on their own
and the rest in int8, with a scale the outliers no longer set (the decomposition of
LLM.int8(), with the channels fixed at load), and each output channel of the weights gets its
own scale. Its scores then move by 0.011 on average, at the CPU of the int8 layers alone
(BENCHMARKS.md, "2026-12-07 (night)").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

# Per layer: the probes show one to four channels far above the rest; eight took the scores'
# mean change from 0.045 (four, feed-forward outputs only) to 0.011 with per-channel weights,
# and sixteen did no better.
OUTLIER_CHANNELS = 8
# Fixed probe pairs (languages of the blind sets and more): the outlier channels are properties
# of the model, the same for every input, so a few pairs find them.
PROBES = (
    ("How do I delete a branch in Git?", "How can I remove a Git branch?"),
    ("Wie lösche ich einen Branch in Git?", "Was kostet ein Ticket nach Berlin?"),
    ("¿Cómo hago una tortilla de patatas?", "Receta de tortilla española, por favor."),
    ("Comment réinitialiser mon mot de passe ?", "J'ai oublié mon mot de passe, que faire ?"),
    ("Как получить СНИЛС?", "Где оформить СНИЛС ребёнку?"),
    ("如何删除 Git 分支？", "怎样在 Git 里创建分支？"),  # noqa: RUF001
    ("東京から大阪まで新幹線でどれくらいかかりますか？", "大阪の天気は？"),  # noqa: RUF001
    ("Qual é a capital da Austrália?", "What is the capital of Australia?"),
)


class OutlierSplitLinear(torch.nn.Module):
    """``dense(x)`` with the input channels ``outliers`` multiplied in float32 and the others by
    ``inner``, a copy of ``dense`` whose columns for those channels are zero (it is what gets
    quantized, and the zeroed channels no longer set its activation scale)."""

    outliers: torch.Tensor
    outlier_weight: torch.Tensor

    def __init__(self, dense: torch.nn.Linear, outliers: torch.Tensor) -> None:
        super().__init__()
        weight = dense.weight.detach()
        self.register_buffer("outliers", outliers.clone())
        self.register_buffer("outlier_weight", weight[:, outliers].t().contiguous())
        self.inner = torch.nn.Linear(dense.in_features, dense.out_features)
        with torch.no_grad():
            self.inner.weight.copy_(weight.index_fill(1, outliers, 0.0))
            self.inner.bias.copy_(dense.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inliers: torch.Tensor = self.inner(x.index_fill(-1, self.outliers, 0.0))
        return inliers + x.index_select(-1, self.outliers).matmul(self.outlier_weight)


def split_outliers(model: Any, encode: Callable[[str, list[str]], Any], k: int = OUTLIER_CHANNELS) -> None:
    """Replaces each linear layer of a (float) BERT ``model``'s encoder by an
    :class:`OutlierSplitLinear` over the ``k`` input channels with the largest activations on
    :data:`PROBES` (``encode(query, candidates)``: the tokenized batch)."""
    encoder = model.bert.encoder
    linears = {n: m for n, m in encoder.named_modules() if isinstance(m, torch.nn.Linear)}
    peaks: dict[str, torch.Tensor] = {}
    hooks = []
    for name, linear in linears.items():

        def record(_module: Any, inputs: tuple[torch.Tensor, ...], _out: Any, name: str = name) -> None:
            peak = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0)
            seen = peaks.get(name)
            peaks[name] = peak if seen is None else torch.maximum(seen, peak)

        hooks.append(linear.register_forward_hook(record))
    try:
        with torch.inference_mode():
            for query, candidate in PROBES:
                model(**encode(query, [candidate]))
    finally:
        for hook in hooks:
            hook.remove()
    for name, linear in linears.items():
        parent, _, attribute = name.rpartition(".")
        outliers = torch.topk(peaks[name], k).indices.sort().values
        setattr(encoder.get_submodule(parent), attribute, OutlierSplitLinear(linear, outliers))


def quantize(model: Any, encode: Callable[[str, list[str]], Any] | None = None) -> Any:
    """Every ``torch.nn.Linear`` of ``model`` in int8 with dynamic activation scales. With
    ``encode``, the encoder's layers are first split by :func:`split_outliers` and the weights
    get a scale per output channel; without, one scale per layer's weights."""
    config = torch.ao.quantization.default_dynamic_qconfig
    if encode is not None:
        split_outliers(model, encode)
        config = torch.ao.quantization.per_channel_dynamic_qconfig
    # (torch.ao.quantization warns that it moves to torchao; it works as it is.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            model, {torch.nn.Linear: config}, dtype=torch.qint8
        )
