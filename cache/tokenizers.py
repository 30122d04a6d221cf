"""Token counters for session truncation: the model's tokenizer, locally or over gRPC.

A turn's count is its text's tokens plus the chat template's framing of one turn
(``<|im_start|>role ... <|im_end|>`` for ChatML), which is measured once from the
template itself rather than assumed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cache.domain import Turn
from services.runtime.errors import FailedPrecondition, Unavailable

log = logging.getLogger(__name__)

_PROBE_SYSTEM = "x"
_PROBE_TEXT = "hello"


def default_tokenizer_dir() -> Path:
    """Where ``llmesh model prepare`` puts the default model (its tokenizer lives there too)."""
    try:
        from services.inference.model import default_model_dir

        return Path(default_model_dir())
    except ImportError:
        from services.runtime.settings import data_dir

        return data_dir() / "models" / "smollm2-135m-instruct"


class LocalTokenCounter:
    """Counts with a Hugging Face tokenizer loaded from a local directory (no network)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._framing: dict[str, int] = {}

    @classmethod
    def load(cls, path: str | Path) -> LocalTokenCounter:
        if not Path(path, "tokenizer_config.json").exists() and not Path(path, "tokenizer.json").exists():
            raise FailedPrecondition(f"no tokenizer in {path} (run `llmesh model prepare`)")
        try:
            from transformers import AutoTokenizer
        except ImportError:
            # The cache image installs llmesh[cache] only: transformers is optional there, and
            # the tokenizer is then InferenceService.Tokenize over gRPC.
            raise FailedPrecondition(
                f"a tokenizer is in {path} but transformers is not installed (llmesh[embeddings])"
            ) from None
        return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    def _tokens(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False)) if text else 0

    def _render(self, messages: list[dict[str, str]]) -> int:
        ids = self._tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    def framing(self, role: str) -> int:
        """Tokens the chat template adds around one turn of ``role``."""
        if role not in self._framing:
            if getattr(self._tok, "chat_template", None):
                # A system turn first, so templates that inject a default system prompt do not.
                base = [{"role": "system", "content": _PROBE_SYSTEM}]
                probe_role = role if role in ("user", "assistant", "system") else "user"
                with_turn = [*base, {"role": probe_role, "content": _PROBE_TEXT}]
                self._framing[role] = max(
                    0, self._render(with_turn) - self._render(base) - self._tokens(_PROBE_TEXT)
                )
            else:
                self._framing[role] = 0
        return self._framing[role]

    def count_sync(self, turns: Sequence[Turn]) -> list[int]:
        return [self._tokens(t.text_for_counting()) + self.framing(t.role) for t in turns]

    async def count_turns(self, turns: Sequence[Turn], model: str = "") -> list[int]:
        # Tokenizing a long session takes a few ms: keep it off the event loop.
        if sum(len(t.content) for t in turns) > 20_000:
            return await asyncio.to_thread(self.count_sync, turns)
        return self.count_sync(turns)


class RemoteTokenCounter:
    """Counts with InferenceService.Tokenize (the served model's own tokenizer)."""

    def __init__(self, tokenize: Any, timeout_s: float = 2.0) -> None:
        # ``tokenize(text, messages) -> int``: the servicer layer wires the gRPC stub in.
        self._tokenize = tokenize
        self._timeout_s = timeout_s
        self._framing: dict[tuple[str, str], int] = {}

    async def _count(self, model: str, text: str = "", messages: Sequence[tuple[str, str]] = ()) -> int:
        try:
            return int(await asyncio.wait_for(self._tokenize(model, text, messages), self._timeout_s))
        except TimeoutError as exc:
            raise Unavailable("inference tokenizer timed out", retry_after_s=1.0) from exc

    async def framing(self, role: str, model: str) -> int:
        key = (role, model)
        if key not in self._framing:
            base = [("system", _PROBE_SYSTEM)]
            probe_role = role if role in ("user", "assistant", "system") else "user"
            whole, alone, text = await asyncio.gather(
                self._count(model, messages=[*base, (probe_role, _PROBE_TEXT)]),
                self._count(model, messages=base),
                self._count(model, text=_PROBE_TEXT),
            )
            self._framing[key] = max(0, whole - alone - text)
        return self._framing[key]

    async def count_turns(self, turns: Sequence[Turn], model: str = "") -> list[int]:
        texts = await asyncio.gather(*(self._count(model, text=t.text_for_counting()) for t in turns))
        framings = {role: await self.framing(role, model) for role in {t.role for t in turns}}
        return [n + framings[t.role] for n, t in zip(texts, turns, strict=True)]
