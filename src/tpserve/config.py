"""EngineConfig: every engine setting and speedup switch in one frozen dataclass.

Each field carries its CLI flag, its `TPSERVE_*` environment variable and a one-line help in
its metadata; the CLI parser and the switch table in docs/switches.md are generated from it.
Precedence: explicit keyword / CLI flag > environment variable > default.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any


def _opt(default: Any, help: str, *, switch: bool = False, advanced: bool = False, flag: str | None = None,
         choices: tuple[str, ...] | None = None) -> Any:
    """A field with its CLI help; `switch`: listed in docs/switches.md; `advanced`: shown by --help-all only."""
    return field(default=default, metadata={"help": help, "switch": switch, "advanced": advanced, "flag": flag,
                                            "choices": choices})


# --quantization and a checkpoint's quant_method, by the names vLLM and ModelOpt use
QUANTIZATION_ALIASES = {"none": "bf16", "bf16": "bf16", "fp8": "fp8", "nvfp4": "nvfp4", "modelopt_fp4": "nvfp4"}


def quantization_method(name: str, what: str = "quantization") -> str:
    """The method a quantization name stands for (bf16, fp8 or nvfp4); an unknown one is a ValueError naming it."""
    key = name.strip().lower()
    if key not in QUANTIZATION_ALIASES:
        raise ValueError(f"{what}: unknown or unsupported quantization method {name!r}; "
                         f"supported: fp8 (block-wise), nvfp4 (modelopt_fp4), none")
    return QUANTIZATION_ALIASES[key]


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = _opt(None, "checkpoint directory (default: the built-in demo model)")
    device: str = _opt("auto", "cpu, cuda or auto (cuda when available)", choices=("auto", "cpu", "cuda"))
    dtype: str = _opt("auto", "auto (bfloat16 on cuda, float32 on cpu), float32, bfloat16 or float16",
                      choices=("auto", "float32", "bfloat16", "float16"))
    seed: int = _opt(0, "seed of the engine's sampler (a request may bring its own)")
    skip_tokenizer_init: bool = _opt(False, "work on token ids only; load no tokenizer")
    tokenizer_cache_words: int = _opt(1024, "words the tokenizer's BPE cache keeps (0: none; docs/serving.md)",
                                      advanced=True)
    load_format: str = _opt("auto", "auto: the safetensors weights; dummy: random weights (needs only config.json)",
                            choices=("auto", "dummy"))
    tensor_parallel_size: int = _opt(1, "number of tensor-parallel ranks (one GPU each)", flag="--tp")
    max_model_len: int | None = _opt(None, "longest prompt + output (default: the checkpoint's)")
    max_num_seqs: int = _opt(64, "most requests running at once")
    max_num_batched_tokens: int = _opt(2048, "most tokens in one forward step (the prefill chunk size)")
    max_waiting: int = _opt(1024, "most requests waiting; beyond it the server answers 503")
    block_size: int = _opt(64, "tokens per cache block (a multiple of index_kpool)")
    kv_cache_memory: float | None = _opt(
        None, "bytes for the MLA / indexer block pool, e.g. 2GiB "
        "(default: from --gpu-memory-utilization on cuda, 256MiB on cpu)")
    gpu_memory_utilization: float = _opt(0.85, "fraction of the GPU's memory this engine may use, whatever "
                                         "other processes hold (engines sharing a GPU each pass their share)")
    enable_prefix_caching: bool = _opt(True, "reuse the cache of earlier requests' shared prompt prefixes (full "
                                       "blocks and KDA state checkpoints; docs/prefix-caching.md)", switch=True)
    prefix_state_memory: float | None = _opt(None, "bytes of the cache budget for prefix caching's KDA state "
                                             "checkpoints (default: a quarter of it, up to half for two per "
                                             "request slot)", switch=True, advanced=True)
    prefix_state_interval: int = _opt(2048, "tokens between KDA state checkpoints within a prompt (0: only at "
                                      "its end)", switch=True, advanced=True)
    # ---- speedup switches (docs/switches.md; measurements in docs/performance.md) ----
    tokenize_in_pieces: bool = _opt(True, "encode a prompt of 8,192+ characters in pieces cut between words, on all "
                                    "cores at once (ids unchanged; engine/tokenizer.py)", switch=True, advanced=True)
    mla_prefill: str = _opt("auto", "MLA of prefill chunks: dense (SDPA under the selection mask), sparse (the "
                            "selected rows only), or auto (sparse once the context reaches 8,192 tokens)",
                            switch=True, advanced=True, choices=("auto", "sparse", "dense"))
    prefill_together: bool = _opt(True, "a step's prefill sequences attend and select in one call (where their "
                                  "contexts total at most 8,192 positions), not a sequence at a time", switch=True,
                                  advanced=True)
    enforce_eager: bool = _opt(False, "no CUDA graphs: run every step eagerly (cuda only)", switch=True)
    warmup: bool | None = _opt(None, "compile and tune every kernel shape before the server reports ready "
                               "(default: on for cuda, off on cpu; docs/serving.md)", switch=True,
                               advanced=True)
    warmup_routes: bool = _opt(True, "with the warm-up, one request down each generation route in process before "
                               "the server accepts connections (the HTTP layer's first-use costs; docs/serving.md)",
                               switch=True, advanced=True)
    merge_linears: bool = _opt(True, "run linears that share an input (gate + up, q + k + v, ...) as one GEMM "
                               "over stacked weights", switch=True, advanced=True)
    async_scheduling: bool = _opt(True, "launch the next decode step before the host reads this step's tokens "
                                  "(outputs unchanged)", switch=True, advanced=True)
    draft_graph: str = _opt("fused", "MTP drafting in CUDA graphs: fused (greedy acceptance and drafts in one "
                            "graph after verify), chain (one replay), depth (one per depth)",
                            switch=True, advanced=True, choices=("fused", "chain", "depth"))
    kda_backend: str = _opt("auto", "KDA kernels: fla (fla-core, cuda), torch, or auto (fla on cuda in "
                            "bf16 / fp16, else torch)", switch=True, advanced=True, choices=("auto", "fla", "torch"))
    kda_chunk_indices: str = _opt("host", "fla-core's KDA prefill chunk indices: host (the host reads the lengths, "
                                  "a wait on the device) or device (built on the device, no wait; self-tested)",
                                  switch=True, advanced=True, choices=("host", "device"))
    kda_short_prefill: int = _opt(0, "fla-core KDA: prefill steps whose prefill sequences have at most this many "
                                  "tokens each run the recurrent kernel (one launch) instead of chunk_kda (0: off)",
                                  switch=True, advanced=True)
    kda_prep_backend: str = _opt("auto", "KDA short conv, forget gate and beta of decode / verify rows: triton "
                                 "(cuda), torch, or auto (triton on cuda)",
                                 switch=True, advanced=True, choices=("auto", "triton", "torch"))
    mhc_backend: str = _opt("auto", "mHC weights (pre / post / Sinkhorn comb): triton (one kernel, cuda), torch, "
                            "or auto (triton on cuda)", switch=True, advanced=True,
                            choices=("auto", "triton", "torch"))
    mhc_project_backend: str = _opt("auto", "mHC stream norm + projection of prefill steps: triton (one kernel, "
                                    "bf16 on cuda), torch (fp32), or auto (triton on cuda)",
                                    switch=True, advanced=True, choices=("auto", "triton", "torch"))
    norm_backend: str = _opt("auto", "RMSNorms and the mHC stream norm / collapse / expand: triton (fused "
                             "kernels, cuda), torch, or auto (triton on cuda)",
                             switch=True, advanced=True, choices=("auto", "triton", "torch"))
    argmax_backend: str = _opt("auto", "the MTP drafter's greedy draws (argmax and probability): triton "
                               "(one kernel, cuda), torch, or auto (triton on cuda)",
                               switch=True, advanced=True, choices=("auto", "triton", "torch"))
    gemv_backend: str = _opt("auto", "16-bit dense linears at 1-16 rows: triton (one GEMV launch, cuda), "
                             "torch (cuBLAS), or auto (triton on cuda)",
                             switch=True, advanced=True, choices=("auto", "triton", "torch"))
    pdl: str = _opt("auto", "programmatic dependent launch between a step's kernels: on (sm_90+ with Triton), "
                    "off, or auto (on where supported)", switch=True, advanced=True, choices=("auto", "on", "off"))
    act_backend: str = _opt("auto", "clamped SwiGLU of MLPs and experts: triton (one kernel, cuda), torch, "
                            "or auto (triton on cuda)", switch=True, advanced=True,
                            choices=("auto", "triton", "torch"))
    moe_backend: str = _opt("auto", "routed experts: triton (grouped GEMMs, no host sync; cuda), torch (a loop "
                            "over experts), or auto (triton on cuda)", switch=True, advanced=True,
                            choices=("auto", "triton", "torch"))
    quant_decode_backend: str = _opt("auto", "FP8 / NVFP4 tiles of the Triton experts: qtile, qtile-b (packed "
                                     "decode), element, or auto (qtile-b on cuda unless float16)", switch=True,
                                     advanced=True, choices=("auto", "qtile", "qtile-b", "element"))
    quant_gemv_backend: str = _opt("auto", "FP8 / NVFP4 linears and NVFP4 experts at decode: cuda (NVRTC "
                                   "kernels), triton, or auto (cuda where NVRTC builds, else triton)",
                                   switch=True, advanced=True, choices=("auto", "cuda", "triton"))
    moe_route_backend: str = _opt("auto", "MoE routing, sorted layout and sum of the k outputs: triton (cuda; "
                                  "not n_group > 1), torch, or auto (triton on cuda)",
                                  switch=True, advanced=True, choices=("auto", "triton", "torch"))
    indexer_topk_backend: str = _opt("auto", "top-k pools of decode / verify tokens: triton (complete pools "
                                     "only; cuda), torch (torch.topk), or auto (as --indexer-backend)",
                                     switch=True, advanced=True, choices=("auto", "triton", "torch"))
    indexer_backend: str = _opt("auto", "DSA indexer's pool compression, decode scores and selection: triton "
                                "(cuda), torch, or auto (triton on cuda)",
                                switch=True, advanced=True, choices=("auto", "triton", "torch"))
    mla_decode_backend: str = _opt("auto", "sparse MLA of decode / verify tokens: triton (paged cache read in "
                                   "place; cuda), torch (gather), or auto (triton on cuda)",
                                   switch=True, advanced=True, choices=("auto", "triton", "torch"))
    moe_triton_max_tokens: int = _opt(2048, "largest forward (tokens) the triton MoE takes (a tokens x top-k x "
                                      "hidden fp32 buffer); longer ones use grouped_mm", switch=True, advanced=True)
    sequence_parallel: bool = _opt(True, "split the residual stream across ranks for forwards of at least "
                                   "--sp-min-tokens tokens (TP > 1)", switch=True, advanced=True, flag="--sp")
    sp_min_tokens: int = _opt(1024, "token count from which sequence parallelism is used", switch=True,
                              advanced=True)
    custom_allreduce: bool = _opt(True, "workspace all-reduce / all-gather / reduce-scatter over peer memory "
                                  "where the size table picks it", switch=True, advanced=True)
    allreduce_workspace_mb: int = _opt(8, "per-rank workspace of the custom collectives (MiB)", switch=True,
                                       advanced=True)
    collective_table: str | None = _opt(None, "size table JSON from `tpserve tune collectives` "
                                        "(default: the tuned cache, else the shipped table)",
                                        switch=True, advanced=True)
    allreduce_topology: str = _opt("mesh", "workspace all-reduce: mesh (every rank reads every peer) or ring "
                                   "(neighbours only; the same sums)", switch=True, advanced=True,
                                   choices=("mesh", "ring"))
    fused_collectives: bool = _opt(True, "fuse the all-reduce with the mHC expand after it, and the MoE combine "
                                   "into the reduce-scatter (TP > 1)", switch=True, advanced=True)
    speculative_config: str | None = _opt(
        None, "speculative decoding as JSON (vLLM's keys), e.g. '{\"method\": \"mtp\", "
        "\"num_speculative_tokens\": 3}' (default: off; docs/serving.md)", switch=True)
    hf_overrides: str | None = _opt(
        None, "model config fields to override, as JSON, e.g. '{\"num_hidden_layers\": 8}'")
    # ---- weights: quantization and snapshots (model/quant.py, model/snapshot.py) ----
    quantization: str | None = _opt(None, "fp8 (block-wise), nvfp4 / modelopt_fp4 or none "
                                    "(default: the checkpoint's quantization_config)")
    dense_fp8: bool = _opt(False, "convert a bf16 checkpoint's dense linears to FP8 at load", switch=True)
    snapshot: bool | None = _opt(None, "restore processed-weight snapshots, or write them on first boot "
                                 "(default: on for cuda, off on cpu and for --load-format dummy)", switch=True)
    snapshot_dir: str | None = _opt(None, "where snapshots live (default: <cache dir>/snapshots)", switch=True)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kda_short_prefill < 0:
            raise ValueError(f"kda_short_prefill must be >= 0, got {self.kda_short_prefill}")
        if self.moe_triton_max_tokens < 0:
            raise ValueError(f"moe_triton_max_tokens must be >= 0, got {self.moe_triton_max_tokens}")
        if self.tokenizer_cache_words < 0:
            raise ValueError(f"tokenizer_cache_words must be >= 0, got {self.tokenizer_cache_words}")
        if self.prefix_state_interval < 0:
            raise ValueError(f"prefix_state_interval must be >= 0, got {self.prefix_state_interval}")
        if self.prefix_state_memory is not None and self.prefix_state_memory < 0:
            raise ValueError(f"prefix_state_memory must be >= 0, got {self.prefix_state_memory}")
        if self.sp_min_tokens < 1:
            raise ValueError(f"sp_min_tokens must be >= 1, got {self.sp_min_tokens}")
        if self.quantization is not None:
            quantization_method(self.quantization)  # unknown / unsupported: a clear error naming it
        if isinstance(self.speculative_config, dict):  # LLM(speculative_config={...})
            object.__setattr__(self, "speculative_config", json.dumps(self.speculative_config, sort_keys=True))
        self.speculative  # noqa: B018 - parse now: a bad speculative_config is an error at construction
        if isinstance(self.hf_overrides, dict):  # LLM(hf_overrides={...})
            object.__setattr__(self, "hf_overrides", json.dumps(self.hf_overrides, sort_keys=True))
        self.overrides  # noqa: B018 - parse now
        if self.overrides.get("num_hidden_layers") is not None and self.speculative is not None:
            raise ValueError("hf_overrides: num_hidden_layers cannot be combined with speculative_config (the MTP "
                             "drafter is the checkpoint's layer after its last one)")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name} must be one of {choices}, got {getattr(self, f.name)!r}")

    @property
    def speculative(self) -> "SpeculativeConfig | None":
        return SpeculativeConfig.parse(self.speculative_config)

    @property
    def overrides(self) -> dict[str, Any]:
        """hf_overrides parsed: a JSON object (its keys are checked against the model config at load)."""
        if self.hf_overrides is None:
            return {}
        try:
            raw = json.loads(self.hf_overrides)
        except json.JSONDecodeError as exc:
            raise ValueError(f"hf_overrides: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"hf_overrides: expected a JSON object, got {type(raw).__name__}")
        return raw

    # ------------------------------------------------------------------ sources
    @staticmethod
    def env_name(name: str) -> str:
        return "TPSERVE_" + name.upper()

    @staticmethod
    def flag_name(f: dataclasses.Field) -> str:
        return f.metadata.get("flag") or "--" + f.name.replace("_", "-")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> "EngineConfig":
        """Defaults, overridden by TPSERVE_* variables, overridden by keyword arguments."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key = cls.env_name(f.name)
            if key in environ:
                values[f.name] = _parse_value(f, environ[key], key)
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown engine option(s): {sorted(unknown)}")
        for name in BYTE_FIELDS:
            if isinstance(values.get(name), str):
                values[name] = parse_bytes(values[name], name)
        return cls(**values)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding with the checkpoint's MTP layer (engine/spec/speculator.py)."""

    method: str = "mtp"
    num_speculative_tokens: int = 3   # most drafts verified per step (k), 1..7
    adaptive: bool = True             # choose k in 0..num_speculative_tokens per step
    truncate_threshold: float = 0.0   # > 0: stop drafting a request when its predicted survival falls below

    @classmethod
    def parse(cls, raw: str | dict | None) -> "SpeculativeConfig | None":
        if raw is None or raw == "":
            return None
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"speculative_config: expected a JSON object, got {type(raw).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: {sorted(known)}")
        spec = cls(**raw)
        if spec.method not in ("mtp", "deepseek_mtp", "glm4_moe_mtp"):
            raise ValueError(f"speculative_config.method: only 'mtp' (the checkpoint's MTP layer) is supported, "
                             f"got {spec.method!r}")
        k = spec.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 7:
            raise ValueError(f"speculative_config.num_speculative_tokens: an integer in 1..7, got {k!r}")
        if not isinstance(spec.adaptive, bool):
            raise ValueError(f"speculative_config.adaptive: true or false, got {spec.adaptive!r}")
        t = spec.truncate_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 1.0:
            raise ValueError(f"speculative_config.truncate_threshold: a number in [0, 1], got {t!r}")
        return spec


BYTE_FIELDS = ("kv_cache_memory", "prefix_state_memory")  # sizes: 2GiB, 512MiB ... (parse_bytes)


def parse_bytes(text: str | float | int, what: str = "kv_cache_memory") -> float:
    """'2GiB', '512MB', '1e9' -> bytes."""
    if isinstance(text, (int, float)):
        return float(text)
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
             "tib": 2**40, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "b": 1, "": 1}
    s = text.strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    if unit not in units or not num:
        raise ValueError(f"{what}: cannot read {text!r} as a size (try 2GiB or 512MiB)")
    return float(num) * units[unit]


def _parse_value(f: dataclasses.Field, raw: str, source: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind.startswith("bool"):
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return parse_bytes(raw, f.name) if f.name in BYTE_FIELDS else float(raw)
        return raw
    except ValueError:
        raise ValueError(f"{source}: cannot read {raw!r} as {kind}") from None


def switch_table_markdown() -> str:
    """The switch table (docs/switches.md), generated from EngineConfig's metadata."""
    rows = ["| switch | CLI flag | environment | default | what it does |",
            "| --- | --- | --- | --- | --- |"]
    for f in dataclasses.fields(EngineConfig):
        if not f.metadata.get("switch"):
            continue
        flag = EngineConfig.flag_name(f)
        if f.type.startswith("bool"):
            flag = f"{flag} / --no-{flag[2:]}"
        rows.append(f"| `{f.name}` | `{flag}` | `{EngineConfig.env_name(f.name)}` | "
                    f"`{f.default}` | {f.metadata['help']} |")
    return "\n".join(rows) + "\n"
