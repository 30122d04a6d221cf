"""The inference core: generation over vLLM's async engine (``AsyncLLM``), no gRPC.

:class:`InferenceEngine` is what the servicer talks to; :class:`VllmEngine` is the
real one. Requests are rendered and turned into sampling parameters by vLLM's
own OpenAI layer (:mod:`services.inference.render` builds its input), so chat
templates, tool parsers and structured outputs behave exactly as in
``vllm serve``. Cancellation (the caller went away) and the request deadline
abort the engine request at once; a full queue is refused up front
(``max_num_seqs + max_waiting_requests`` unfinished requests, vLLM's
``max_num_queued_reqs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes.util
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from services.inference import metrics, outputs, render
from services.inference.coalesce import Coalescer
from services.inference.config import MAX_STREAM_INTERVAL, TCMALLOC, Dtype, InferenceSettings
from services.inference.kv_events import KvEventFeed, Update
from services.inference.kv_holdings import KvHoldings
from services.inference.model import model_revision
from services.inference.prompt_tokens import remember_segments
from services.inference.types import (
    Choice,
    GenerateRequest,
    GenerateResult,
    Message,
    ModelInfo,
    Sampling,
    StreamChunk,
    TokenizeRequest,
    TokenizeResult,
    ToolCall,
)
from services.runtime import context
from services.runtime.errors import (
    DeadlineExceeded,
    InvalidArgument,
    LlmeshError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)

log = logging.getLogger(__name__)


class InferenceEngine(Protocol):
    """What the servicer needs from an engine."""

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    def generate_stream(self, request: GenerateRequest) -> AsyncIterator[StreamChunk]: ...

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult: ...

    def model_info(self, model: str) -> ModelInfo: ...

    def watch_prefixes(self) -> AsyncIterator[Update]: ...


def configure_environment(settings: InferenceSettings) -> None:
    """Environment vLLM reads at import and when its engine process starts.

    vLLM's loggers then propagate to ours (JSON on stderr) instead of printing to stdout.
    """
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{settings.kv_cache_space_gib:g}"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = settings.threads_bind()
    if settings.malloc == "tcmalloc":
        preload_tcmalloc()


def preload_tcmalloc() -> str | None:
    """Puts tcmalloc in ``LD_PRELOAD`` for the engine processes vLLM spawns (it keeps an
    existing tcmalloc entry and adds its libgomp); the library's name, or None if missing."""
    current = os.environ.get("LD_PRELOAD", "")
    if "libtcmalloc" in current:
        return next(p for p in current.split(":") if "libtcmalloc" in p)
    found = ctypes.util.find_library(TCMALLOC)
    if found is None:
        log.warning(
            "tcmalloc not found (Debian: libtcmalloc-minimal4): the engine uses glibc malloc, "
            "whose heap creeps up under steady load"
        )
        return None
    os.environ["LD_PRELOAD"] = ":".join(p for p in (found, current) if p)
    return found


def chunked_prefill_enabled(settings: InferenceSettings) -> bool:
    """Whether the engine runs with chunked prefill (see the setting)."""
    if settings.chunked_prefill != "auto":
        return settings.chunked_prefill == "on"
    from vllm.platforms import current_platform

    return not current_platform.is_cpu()


# The CPU backend's default KV block (see InferenceSettings.block_size).
CPU_BLOCK_SIZE = 32


def engine_block_size(settings: InferenceSettings) -> int | None:
    """Tokens per KV-cache block: the setting, else 32 on the CPU backend; None = vLLM's default."""
    if settings.block_size is not None:
        return settings.block_size
    from vllm.platforms import current_platform

    return CPU_BLOCK_SIZE if current_platform.is_cpu() else None


def engine_dtype(settings: InferenceSettings) -> Dtype:
    """The dtype the engine runs in: the setting, where ``auto`` on a CPU without native bf16
    arithmetic (AVX512_BF16 or AMX) is float32. There the bf16 checkpoint's weights make oneDNN
    give up ("could not create a primitive descriptor") and every linear layer falls back to
    emulated bf16: float32 decoded several times faster on an AVX2 host (BENCHMARKS.md,
    "inference: the engine's dtype on CPUs without bf16"), for twice the weights' and the KV
    cache's memory."""
    if settings.dtype != "auto":
        return settings.dtype
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "auto"
    return "auto" if cpu_has_native_bf16() else "float32"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU does bf16 arithmetic itself (AVX512_BF16 or AMX tiles)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


@dataclass
class _Prepared:
    """A request rendered for the engine: engine input, sampling params, parsers' view."""

    request_id: str
    vllm_request: Any
    engine_input: Any
    sampling: Any
    prompt_tokens: int
    tool_parsing: bool
    forced_function: bool
    # Tokens of a resumed stream already generated elsewhere (counted as completion tokens).
    resumed: int = 0
    # A resumed stream that already has its max_tokens: it only needs its last message.
    exhausted: bool = False
    # Engine steps per streamed message once the first word is out (services/inference/coalesce.py).
    stream_interval: int = 1
    arrival: float = field(default_factory=time.time)


class VllmEngine:
    """One vLLM ``AsyncLLM`` serving one model."""

    def __init__(
        self,
        settings: InferenceSettings,
        llm: Any,
        online_renderer: Any,
        revision: str,
        kv_feed: KvEventFeed | None = None,
    ) -> None:
        self._settings = settings
        self._llm: Any = llm
        self._renderer = online_renderer
        self._tokenizer = llm.renderer.get_tokenizer()
        self._model_config = llm.model_config
        self._defaults: dict[str, Any] = llm.model_config.get_diff_sampling_param()
        self._names = {"", settings.model_name(), *settings.aliases}
        self._revision = revision
        self._snapshot = _SNAPSHOT
        self._labels = (settings.model_name(),)
        self.on_dead: Callable[[], None] | None = None
        # The engine's KV-cache events (None: LLMESH_INFERENCE_KV_EVENTS off, or no prefix caching).
        self.kv_feed = kv_feed

    # -- lifecycle -----------------------------------------------------------------

    @classmethod
    async def start(cls, settings: InferenceSettings) -> VllmEngine:
        """Starts the engine (spawns its process; call under ``if __name__ == "__main__"``)."""
        path = settings.model_path()
        if not settings.model and not await asyncio.to_thread(Path(path).is_dir):
            raise Unavailable(f"the default model is not prepared at {path}: run `llmesh model prepare`")
        configure_environment(settings)
        import vllm.envs as vllm_envs
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.renderers.online_renderer import OnlineRenderer
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.monotonic()
        optional: dict[str, Any] = {}
        if settings.max_model_len is not None:
            optional["max_model_len"] = settings.max_model_len
        if settings.kv_cache_blocks is not None:
            optional["num_gpu_blocks_override"] = settings.kv_cache_blocks
        block_size = engine_block_size(settings)
        if block_size is not None:
            optional["block_size"] = block_size
        if not chunked_prefill_enabled(settings):
            optional["enable_chunked_prefill"] = False
        events_dir: str | None = None
        if settings.kv_events and settings.enable_prefix_caching:
            from vllm.config.kv_events import KVEventsConfig

            # A private directory (mode 0700): only this replica reads or writes its events.
            events_dir = await asyncio.to_thread(tempfile.mkdtemp, prefix="llmesh-kv-events-")
            optional["kv_events_config"] = KVEventsConfig(
                enable_kv_cache_events=True, publisher="zmq", endpoint=f"ipc://{events_dir}/events"
            )
        args = AsyncEngineArgs(
            model=path,
            served_model_name=[settings.model_name()],
            dtype=engine_dtype(settings),
            tensor_parallel_size=settings.tensor_parallel_size,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_queued_reqs=settings.max_num_seqs + settings.max_waiting_requests,
            enable_prefix_caching=settings.enable_prefix_caching,
            enforce_eager=settings.enforce_eager,
            seed=settings.seed,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            max_logprobs=settings.max_logprobs,
            scheduling_policy="priority",
            disable_log_stats=True,
            **optional,
        )
        config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
        factory = metrics.stat_logger_factory(settings.model_name(), _SNAPSHOT)
        # Our stat logger (llmesh_inference_* series), in place of vLLM's Prometheus logger.
        llm = AsyncLLM.from_vllm_config(config, stat_loggers=[factory], disable_log_stats=True)
        # vLLM reads its settings from the environment at every use until this is called, which
        # its engine process does once started and its API server never does: this process read
        # os.environ twice per generated token (VLLM_COMPUTE_NANS_IN_LOGITS, in its per-token
        # stats). The environment is final here (configure_environment ran above).
        vllm_envs.enable_envs_cache()
        chat_template = _load_template(settings.chat_template)
        online_renderer = OnlineRenderer(
            llm.model_config,
            llm.renderer,
            request_logger=None,
            chat_template=chat_template,
            chat_template_content_format="auto",
            enable_auto_tools=bool(settings.tool_parser),
            tool_parser=settings.tool_parser or None,
            tool_strict_level=settings.tool_strict_level,
        )
        # The tokenizer vLLM's renderer calls remembers the text between special tokens: a
        # prompt's system prompt and earlier turns are not tokenized again (prompt_tokens.py).
        memo = await asyncio.to_thread(
            remember_segments,
            llm.renderer.get_tokenizer(),
            max_chars=settings.prompt_memo_chars,
            chat_template=chat_template,
            count=_prompt_chars_counter(settings.model_name()),
        )
        log.info("prompt tokens remembered between special tokens: %s", "yes" if memo else "no")
        revision = await asyncio.to_thread(model_revision, path)
        feed: KvEventFeed | None = None
        if events_dir is not None:
            cache_config = llm.vllm_config.cache_config
            feed = KvEventFeed(
                f"ipc://{events_dir}/events",
                KvHoldings(int(cache_config.block_size)),
                int(cache_config.num_gpu_blocks or 0),
            )
            await feed.start()
        engine = cls(settings, llm, online_renderer, revision, feed)
        await engine.warm_up()
        cache = llm.vllm_config.cache_config
        metrics.KV_BLOCK_TOKENS.labels(settings.model_name()).set(int(cache.block_size))
        metrics.KV_BLOCKS.labels(settings.model_name()).set(int(cache.num_gpu_blocks or 0))
        log.info(
            "engine ready in %.1f s: model %s (%s), max_model_len %d, KV cache %d blocks of %d tokens, "
            "revision %s",
            time.monotonic() - started,
            settings.model_name(),
            path,
            llm.model_config.max_model_len,
            int(cache.num_gpu_blocks or 0),
            int(cache.block_size),
            revision[:16],
        )
        return engine

    async def warm_up(self) -> None:
        """Renders one chat request (template and tokenization, nothing generated) before the
        replica serves: vLLM loads what chat rendering needs on first use, which cost the first
        client request ~0.7 s (BENCHMARKS.md, "inference: the first request"). A failure only
        leaves that cost to the first request (logged, metric 0)."""
        request = GenerateRequest(
            messages=[Message(role="user", content="Hello")], sampling=Sampling(max_tokens=1)
        )
        started = time.monotonic()
        try:
            # A task of its own: the request context it makes stays there.
            await asyncio.create_task(self._prepare(request, stream=True))
        except Exception as exc:  # the replica serves either way
            log.warning("warm-up: rendering a chat failed (%s); the first request pays for it", exc)
            metrics.WARM_UP.labels(self._settings.model_name()).set(0)
            return
        elapsed = time.monotonic() - started
        metrics.WARM_UP.labels(self._settings.model_name()).set(elapsed)
        log.info("warm-up: rendered a chat in %.2f s", elapsed)

    async def close_feed(self) -> None:
        """Stops reading KV events and removes their socket's directory."""
        if self.kv_feed is None:
            return
        await self.kv_feed.close()
        directory = self.kv_feed.endpoint.removeprefix("ipc://").rsplit("/", 1)[0]
        await asyncio.to_thread(shutil.rmtree, directory, True)

    def watch_prefixes(self) -> AsyncIterator[Update]:
        """The held prefixes: a snapshot, then changes (UNAVAILABLE without KV events)."""
        if self.kv_feed is None:
            raise Unavailable(
                "this replica publishes no KV-cache events (LLMESH_INFERENCE_KV_EVENTS=false "
                "or prefix caching off)"
            )
        return self.kv_feed.watch()

    def close(self) -> None:
        self._llm.shutdown()
        # Dropping the last reference now lets AsyncLLM.__del__ (a second shutdown) run
        # while the interpreter is whole, not during its teardown.
        self._llm = None

    async def check_health(self) -> bool:
        """False once the engine process is dead (it does not come back)."""
        if self._llm.errored:
            return False
        try:
            await self._llm.check_health()
        except Exception:
            log.exception("engine health check failed")
            return False
        return True

    # -- generation ----------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generates every choice to the end and returns them at once."""
        prepared = await self._prepare(request, stream=False)
        final: Any = None
        async with self._guard(prepared) as results:
            async for output in results:
                final = output
        if final is None:
            raise Unavailable("the engine returned no output")
        choices: list[Choice] = []
        forced = prepared.forced_function
        for out in sorted(final.outputs, key=lambda o: o.index):
            text, calls = out.text, list[ToolCall]()
            if prepared.tool_parsing:
                reader = self._reader(prepared, final.prompt_token_ids)
                text, calls = reader.parse(out.text, out.token_ids)
            choices.append(
                Choice(
                    index=out.index,
                    text=text,
                    tool_calls=calls,
                    finish_reason=outputs.finish_reason(
                        out.finish_reason, tool_calls=bool(calls), forced_function=forced
                    ),
                    stop_reason=outputs.stop_reason(out.stop_reason, self._tokenizer),
                    logprobs=self._logprobs(prepared, out.token_ids, out.logprobs),
                )
            )
        completion = sum(len(o.token_ids) for o in final.outputs)
        return GenerateResult(
            id=prepared.request_id,
            model=self._settings.model_name(),
            revision=self._revision,
            choices=choices,
            usage=outputs.usage(prepared.prompt_tokens, completion, final.num_cached_tokens),
            timings=outputs.timings(final.metrics, prepared.arrival),
        )

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[StreamChunk]:
        """Yields one chunk per engine step, or per ``stream_interval`` steps once the first
        word is out (services/inference/coalesce.py); the last one carries usage and timings."""
        prepared = await self._prepare(request, stream=True)
        readers: dict[int, outputs.ToolCallReader] = {}
        seen_calls: dict[int, bool] = {}
        completion = prepared.resumed
        if prepared.exhausted:
            yield StreamChunk(
                id=prepared.request_id,
                model=self._settings.model_name(),
                revision=self._revision,
                deltas=[Choice(index=0, finish_reason="length")],
                usage=outputs.usage(prepared.prompt_tokens, completion, 0),
                timings=outputs.timings(None, prepared.arrival),
            )
            return
        busy_streams = self._settings.busy_streams
        joined = Coalescer(
            prepared.stream_interval,
            lambda: self._snapshot.steps,
            lambda: self._snapshot.running >= busy_streams,
            self._settings.busy_stream_interval,
        )
        async with self._guard(prepared) as results:
            async for output in results:
                deltas: list[Choice] = []
                for out in output.outputs:
                    completion += len(out.token_ids)
                    finished = out.finish_reason is not None
                    text, calls = out.text, list[ToolCall]()
                    if prepared.tool_parsing:
                        if out.index not in readers:
                            readers[out.index] = self._reader(prepared, output.prompt_token_ids)
                        text, calls = readers[out.index].parse_delta(
                            out.text, out.token_ids, finished=finished
                        )
                        seen_calls[out.index] = seen_calls.get(out.index, False) or bool(calls)
                    deltas.append(
                        Choice(
                            index=out.index,
                            text=text,
                            tool_calls=calls,
                            finish_reason=outputs.finish_reason(
                                out.finish_reason,
                                tool_calls=seen_calls.get(out.index, False),
                                forced_function=prepared.forced_function,
                            ),
                            stop_reason=outputs.stop_reason(out.stop_reason, self._tokenizer),
                            logprobs=self._logprobs(prepared, out.token_ids, out.logprobs),
                            token_ids=list(out.token_ids),
                        )
                    )
                chunk = StreamChunk(
                    id=prepared.request_id,
                    model=self._settings.model_name(),
                    revision=self._revision,
                    deltas=deltas,
                )
                if output.finished:
                    chunk.usage = outputs.usage(prepared.prompt_tokens, completion, output.num_cached_tokens)
                    chunk.timings = outputs.timings(output.metrics, prepared.arrival)
                for message in joined.add(chunk):
                    yield message
            for message in joined.flush():
                yield message

    @contextlib.asynccontextmanager
    async def _guard(self, prepared: _Prepared) -> AsyncIterator[AsyncIterator[Any]]:
        """The engine's output stream for one request, under the deadline, errors mapped.

        Leaving the block early (cancellation, deadline, a closed stream) closes
        vLLM's generator, which aborts the engine request right away.
        """
        remaining = context.current().time_remaining()
        results = self._llm.generate(
            prepared.engine_input,
            prepared.sampling,
            prepared.request_id,
            priority=prepared.vllm_request.priority,
        )
        try:
            async with contextlib.aclosing(results), asyncio.timeout(remaining):
                yield results
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"the deadline passed after {time.time() - prepared.arrival:.2f} s; the request was aborted"
            ) from exc
        except LlmeshError:
            raise
        except Exception as exc:
            raise self._engine_error(exc) from exc

    def _engine_error(self, exc: Exception) -> Exception:
        admission_error, client_error, dead_error = vllm_error_types()
        if isinstance(exc, admission_error):
            metrics.ADMISSION_REJECTIONS.labels(*self._labels).inc()
            return ResourceExhausted(
                f"the engine is full: {self._llm.get_num_unfinished_requests()} requests running or waiting "
                f"(max_num_seqs {self._settings.max_num_seqs} + max_waiting_requests "
                f"{self._settings.max_waiting_requests}); retry later or on another replica",
                retry_after_s=1.0,
            )
        if isinstance(exc, dead_error):
            if self.on_dead is not None:
                self.on_dead()
            return Unavailable("the inference engine has died; this replica no longer serves")
        if isinstance(exc, client_error | ValueError):
            return InvalidArgument(str(exc))
        return exc

    async def _prepare(self, request: GenerateRequest, *, stream: bool) -> _Prepared:
        from pydantic import ValidationError

        self._resolve(request.model)
        if self._llm.errored:
            raise Unavailable("the inference engine has died; this replica no longer serves")
        render.check_input(request.messages, request.prompt)
        render.check_sampling(request.sampling, self._settings.max_logprobs)
        request_id = f"gen-{context.current().request_id}-{uuid.uuid4().hex[:8]}"
        chat = request.prompt is None
        name = self._settings.model_name()
        try:
            if chat:
                from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

                body = render.chat_request_dict(request, name, stream=stream)
                vllm_request: Any = ChatCompletionRequest.model_validate(body)
            else:
                from vllm.entrypoints.openai.completion.protocol import CompletionRequest

                body = render.completion_request_dict(request, name, stream=stream)
                vllm_request = CompletionRequest.model_validate(body)
        except ValidationError as exc:
            raise InvalidArgument(_pydantic_message(exc)) from exc
        engine_input = await self._render(request, vllm_request, chat)
        prompt_tokens = len(engine_input["prompt_token_ids"])
        max_model_len = int(self._model_config.max_model_len)
        resumed = len(request.resume_token_ids)
        wanted = request.sampling.max_tokens
        if resumed:
            self._check_resume(request)
            engine_input = resume_input(engine_input, request.resume_token_ids)
            if wanted is not None:
                # Every token was generated already (the replica died before its last message):
                # one step more would pass max_tokens, so the engine is not asked (see generate_stream).
                wanted = max(1, wanted - resumed)
        max_tokens = render.check_context(prompt_tokens + resumed, wanted, max_model_len)
        route = request.route_prefix
        if route is not None and self.kv_feed is not None and not resumed:
            self.kv_feed.expect(
                route.keys, route.block_chars, route.text_chars, engine_input["prompt_token_ids"]
            )
        try:
            sampling = vllm_request.to_sampling_params(max_tokens, self._defaults)
        except (ValueError, ValidationError) as exc:
            raise InvalidArgument(str(exc)) from exc
        if resumed and sampling.min_tokens:
            sampling.min_tokens = max(0, sampling.min_tokens - resumed)
        interval = 1
        if stream:
            interval = request.stream_interval or self._settings.stream_interval
            if not 1 <= interval <= MAX_STREAM_INTERVAL:
                raise InvalidArgument(f"stream_interval must be 1..{MAX_STREAM_INTERVAL}, got {interval}")
        tool_parsing = bool(
            chat
            and request.tools
            and self._renderer.parser is not None
            and request.tool_choice.mode != "none"
        )
        return _Prepared(
            request_id=request_id,
            vllm_request=vllm_request,
            engine_input=engine_input,
            sampling=sampling,
            prompt_tokens=prompt_tokens,
            tool_parsing=tool_parsing,
            forced_function=request.tool_choice.function is not None,
            resumed=resumed,
            exhausted=bool(resumed)
            and request.sampling.max_tokens is not None
            and resumed >= request.sampling.max_tokens,
            stream_interval=interval,
        )

    def _check_resume(self, request: GenerateRequest) -> None:
        """What a resumed stream may be: one plain-text choice, tokens of this vocabulary.

        Tool-call parsing and structured output follow the whole answer from its first token;
        an engine that sees only its continuation cannot take them over.
        """
        if request.sampling.n > 1:
            raise InvalidArgument("resume_token_ids needs sampling.n = 1")
        if request.tools:
            raise InvalidArgument("resume_token_ids cannot be combined with tools")
        if request.response_format.type != "text":
            raise InvalidArgument("resume_token_ids cannot be combined with a JSON response_format")
        vocab = int(self._model_config.get_vocab_size())
        bad = next((t for t in request.resume_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidArgument(f"resume_token_ids: {bad} is not a token id of this model (vocab {vocab})")

    async def _render(self, request: GenerateRequest, vllm_request: Any, chat: bool) -> Any:
        """vLLM renders (template, tokenization, tool grammar); too-long prompts are measured here."""
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.exceptions import VLLMValidationError

        try:
            if chat:
                result = await self._renderer.render_chat(vllm_request)
            else:
                result = await self._renderer.render_completion(vllm_request)
        except VLLMValidationError as exc:
            if exc.parameter in ("input_tokens", "input_text"):
                count = await self._count(
                    request.messages, request.prompt, request.tools, request.add_generation_prompt
                )
                render.check_context(
                    count, request.sampling.max_tokens, int(self._model_config.max_model_len)
                )
            raise InvalidArgument(str(exc)) from exc
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidArgument(f"cannot render the request: {exc}") from exc
        if isinstance(result, ErrorResponse):
            raise InvalidArgument(result.error.message)
        inputs = result[1] if chat else result
        return inputs[0]

    def _reader(self, prepared: _Prepared, prompt_token_ids: Any) -> outputs.ToolCallReader:
        parser_cls = self._renderer.parser
        kwargs = self._renderer.effective_chat_template_kwargs(prepared.vllm_request)
        parser = parser_cls(
            self._tokenizer,
            prepared.vllm_request.tools,
            chat_template_kwargs=kwargs,
            model_config=self._model_config,
        )
        return outputs.ToolCallReader(parser, prepared.vllm_request, prompt_token_ids)

    def _logprobs(self, prepared: _Prepared, token_ids: Any, logprobs: Any) -> list[Any]:
        if prepared.sampling.logprobs is None:
            return []
        return outputs.token_logprobs(token_ids, logprobs, int(prepared.sampling.logprobs), self._tokenizer)

    # -- tokenize / info -------------------------------------------------------------

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        """Token count (and ids) of a prompt or of chat messages as the template renders them."""
        self._resolve(request.model)
        render.check_input(request.messages, request.prompt)
        ids = await asyncio.to_thread(
            self._token_ids, request.messages, request.prompt, request.tools, request.add_generation_prompt
        )
        return TokenizeResult(
            count=len(ids),
            token_ids=ids if request.return_token_ids else [],
            max_model_len=int(self._model_config.max_model_len),
        )

    async def _count(self, messages: Any, prompt: str | None, tools: Any, add_generation_prompt: bool) -> int:
        ids = await asyncio.to_thread(self._token_ids, messages, prompt, tools, add_generation_prompt)
        return len(ids)

    def _token_ids(
        self, messages: Any, prompt: str | None, tools: Any, add_generation_prompt: bool
    ) -> list[int]:
        tokenizer = self._tokenizer
        if prompt is not None:
            return list(tokenizer.encode(prompt))
        kwargs: dict[str, Any] = {}
        if self._renderer.chat_template:
            kwargs["chat_template"] = self._renderer.chat_template
        try:
            text = tokenizer.apply_chat_template(
                render.message_dicts(messages),
                tools=render.tool_dicts(tools) or None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **kwargs,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidArgument(f"cannot render the messages with the chat template: {exc}") from exc
        return list(tokenizer.encode(text, add_special_tokens=False))

    def model_info(self, model: str) -> ModelInfo:
        self._resolve(model)
        config = self._model_config
        return ModelInfo(
            name=self._settings.model_name(),
            revision=self._revision,
            path=self._settings.model_path(),
            max_model_len=int(config.max_model_len),
            supports_tools=self._renderer.parser is not None,
            supports_json_schema=True,
            tool_parser=self._settings.tool_parser,
            dtype=str(config.dtype).removeprefix("torch."),
            vocab_size=int(config.get_vocab_size()),
            aliases=list(self._settings.aliases),
            max_num_seqs=self._settings.max_num_seqs,
            max_waiting_requests=self._settings.max_waiting_requests,
            unfinished_requests=int(self._llm.get_num_unfinished_requests()),
            running_requests=self._snapshot.running,
            waiting_requests=self._snapshot.waiting,
        )

    def _resolve(self, model: str) -> None:
        if model not in self._names:
            served = ", ".join(sorted(n for n in self._names if n))
            raise NotFound(f"model {model!r} is not served here (served: {served})")


_SNAPSHOT = metrics.SchedulerSnapshot()


def resume_input(engine_input: Any, resume_token_ids: list[int]) -> Any:
    """The rendered prompt followed by the tokens a resumed stream already produced.

    The prompt's text and character offsets no longer describe these ids, so they go; the
    detokenizer reads the last prompt ids for context, so the first new token decodes as it
    would have mid-stream.
    """
    resumed = {k: v for k, v in engine_input.items() if k not in ("prompt", "prompt_token_offsets")}
    resumed["prompt_token_ids"] = [*engine_input["prompt_token_ids"], *resume_token_ids]
    return resumed


def vllm_error_types() -> tuple[type[Exception], type[Exception], type[Exception]]:
    """vLLM's admission-rejection, bad-request and dead-engine errors (imported late: vLLM pulls in torch)."""
    from vllm.exceptions import GracefulHTTPError, VLLMClientError
    from vllm.v1.engine.exceptions import EngineDeadError

    return GracefulHTTPError, VLLMClientError, EngineDeadError


def _prompt_chars_counter(model: str) -> Callable[[bool, int], None]:
    remembered = metrics.PROMPT_CHARS.labels(model, "remembered")
    tokenized = metrics.PROMPT_CHARS.labels(model, "tokenized")

    def count(hit: bool, chars: int) -> None:
        (remembered if hit else tokenized).inc(chars)

    return count


def _load_template(value: str | None) -> str | None:
    if not value:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    return value


def _pydantic_message(exc: Any) -> str:
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg")))
    return "; ".join(parts) or str(exc)
