"""The layer-by-layer distillation loss of benchmarks/semantic_verifier_train.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks.semantic_verifier_train import _hidden_loss  # noqa: E402


def test_the_loss_is_zero_when_the_student_matches_its_teacher_on_the_real_tokens() -> None:
    student = [torch.randn(2, 5, 4) for _ in range(3)]  # 3 layers, batch 2, 5 tokens padded
    teacher = [torch.stack([layer[row, :n] for layer in student]).half() for row, n in ((0, 5), (1, 3))]
    # What the second pair's padding holds does not count.
    for layer in student:
        layer[1, 3:] = 100.0
    assert _hidden_loss(student, teacher).item() == pytest.approx(0.0, abs=1e-3)


def test_the_loss_is_the_squared_distance_per_token_summed_over_layers() -> None:
    student = [torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)]
    teacher = [torch.ones(2, 2, 4).half()]  # every element 1 away, on both layers
    # Per token and layer: mean over the width = 1; two layers: 2 per token.
    assert _hidden_loss(student, teacher).item() == pytest.approx(2.0)
