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


def _opt(default: Any, help: str, *, switch: bool = False, flag: str | None = None,
         choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "switch": switch, "flag": flag,
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
    model: str | None = _opt(None, "checkpoint directory (default: the built-in trained demo model)")
    device: str = _opt("auto", "cpu, cuda or auto (cuda when available)",
                       choices=("auto", "cpu", "cuda"))
    dtype: str = _opt("auto", "weight/activation dtype: auto (bfloat16 on cuda, float32 on cpu), "
                      "float32, bfloat16, float16",
                      choices=("auto", "float32", "bfloat16", "float16"))
    seed: int = _opt(0, "seed of the engine's sampler (requests may bring their own)")
    skip_tokenizer_init: bool = _opt(False, "work on token ids only; no tokenizer is loaded")
    tokenizer_cache_words: int = _opt(1024, "words the tokenizer's BPE cache keeps (HF tokenizers' own default, "
                                      "10,000, holds up to ~80 MiB of long unique words in a server's heap); 0: none")
    load_format: str = _opt("auto", "auto: read the safetensors weights; dummy: random weights (benchmarks; "
                            "only config.json is needed)", choices=("auto", "dummy"))
    tensor_parallel_size: int = _opt(1, "number of tensor-parallel ranks", flag="--tp")
    max_model_len: int | None = _opt(None, "longest prompt + output (default: the checkpoint's)")
    max_num_seqs: int = _opt(64, "most requests running at once")
    max_num_batched_tokens: int = _opt(2048, "most tokens in one forward step (prefill chunk size)")
    max_waiting: int = _opt(1024, "most requests waiting; beyond this the server answers 503")
    block_size: int = _opt(64, "tokens per cache block (a multiple of index_kpool)")
    kv_cache_memory: float | None = _opt(
        None, "bytes for the MLA/indexer block pool (accepts 2GiB, 512MiB ...); default: "
        "from --gpu-memory-utilization on cuda, 256MiB on cpu")
    gpu_memory_utilization: float = _opt(0.85, "fraction of GPU memory the engine may use")
    enable_prefix_caching: bool = _opt(True, "reuse the cache of earlier requests' shared prompt prefixes (full "
                                       "blocks + KDA state checkpoints; engine/prefix_cache.py)", switch=True)
    prefix_state_memory: float | None = _opt(None, "bytes of the cache budget for KDA state checkpoints of "
                                             "prefix caching (default: a quarter of it)", switch=True)
    prefix_state_interval: int = _opt(2048, "prefix caching also keeps the KDA state every this many prompt "
                                      "tokens (rounded up to a block; 0: only at each prompt's end)", switch=True)
    # ---- speedup switches (docs/switches.md) ----
    mla_prefill: str = _opt("auto", "MLA attention of prefill chunks: dense (the context's latent expanded to "
                            "keys/values, SDPA under the selection mask), sparse (each query attends only its "
                            "<= index_topk selected latent rows, kv_b_proj absorbed; with --mla-decode-backend triton "
                            "one kernel call per 4,096 queries, all 64 heads of a token per program), or auto "
                            "(sparse for a sequence whose chunk reaches 8,192 positions, else dense: on an H200 "
                            "dense took 58.6-59.3 ms against sparse 59.8-60.6 at 4k tokens, sparse 95.9-96.1 "
                            "against dense 99.6 at 8k, BENCHMARKS.md fifteenth session)",
                            switch=True, choices=("auto", "sparse", "dense"))
    enforce_eager: bool = _opt(False, "run every step eagerly: no CUDA graphs (by default, decode steps of up "
                               "to --max-num-seqs sequences replay graphs captured at start, and with "
                               "speculation the verify, KDA commit and MTP draft steps of up to 16; cuda only)",
                               switch=True)
    merge_linears: bool = _opt(True, "linears that read the same input run as one GEMM over their weights stacked at "
                               "load (the dense MLPs' gate + up, KDA's q + k + v and f_a + g_a + b, MLA's q_a + "
                               "kv_a; 16-bit weights without bias): one weight stream and one launch at decode "
                               "instead of one per linear (model/merged.py)", switch=True)
    async_scheduling: bool = _opt(True, "launch a decode step before the host has read the previous step's tokens "
                                  "(they feed the next step on the device): appending tokens, stop checks and "
                                  "detokenizing overlap the GPU's next step (vLLM's --async-scheduling). Decode "
                                  "steps of requests without penalties or grammars, at any TP (with speculation: its "
                                  "idle steps above the verify graphs); other steps run synchronously; outputs "
                                  "identical either way (engine/overlap.py)", switch=True)
    draft_graph: str = _opt("fused", "MTP drafting in graph steps: chain (the catch-up and every chained depth in "
                            "one CUDA graph, each greedy draft fed to the next depth on the GPU: one replay and "
                            "one host copy per step), fused (chain, and a step where every request verifies "
                            "num_speculative_tokens drafts greedily runs the acceptance, KDA commit, catch-up and "
                            "chain in one more graph right after the verify graph: two replays and one host copy "
                            "per step; sequences with fewer drafts padded) or depth (a replay and a host copy per "
                            "depth); chain is used when every drafting request is greedy and drafts "
                            "num_speculative_tokens", switch=True,
                            choices=("fused", "chain", "depth"))
    kda_backend: str = _opt("auto", "KDA kernels: fla (fla-core Triton, cuda only; its recurrent kernel (decode, "
                            "verify, commit) and chunked kernel (prefill) self-tested at start, each replaced by "
                            "torch where it disagrees), torch, or auto (fla on cuda in bf16/fp16, torch in fp32)",
                            switch=True, choices=("auto", "fla", "torch"))
    kda_prep_backend: str = _opt("auto", "KDA layers' short conv of decode and verify rows (state updated in "
                                 "place), forget gate and beta: triton (two kernels, cuda only), torch (about 20 "
                                 "small ops per layer), or auto (triton on cuda)", switch=True,
                                 choices=("auto", "triton", "torch"))
    mhc_backend: str = _opt("auto", "mHC weights (pre / post / Sinkhorn-normalised comb): triton (one fused "
                            "kernel, cuda only), torch (about 120 small ops per block), or auto (triton on "
                            "cuda)", switch=True, choices=("auto", "triton", "torch"))
    mhc_project_backend: str = _opt("auto", "the mHC stream norm and projection of steps with prefill tokens: triton "
                                    "(one kernel reading the bf16 streams once, the projection's fp32 weight split "
                                    "into three bf16 parts for exact products on tensor cores; bf16 models on cuda, "
                                    "kernels/hc_project_triton.py; on an H200 0.86 against 1.13 ms per block at "
                                    "16k tokens, its error 4.6e-5 of the largest output against 3.6e-6), torch (the "
                                    "norm written in fp32, then an fp32 GEMM), or auto (triton on cuda). Decode and "
                                    "verify steps keep the two kernels",
                                    switch=True, choices=("auto", "triton", "torch"))
    norm_backend: str = _opt("auto", "RMSNorms, the KDA output norm and the mHC stream norm, collapse and expand: "
                             "triton (one fused kernel each, cuda only; the demo model's decode step replays 747 "
                             "kernels instead of 1,042), torch (plain ops, the reference), or auto (triton on cuda)",
                             switch=True, choices=("auto", "triton", "torch"))
    argmax_backend: str = _opt("auto", "the MTP drafter's greedy draws in speculative decoding (each row's argmax "
                               "and its probability): triton (one kernel per call, cuda only), torch (max, "
                               "logsumexp, exp, casts and a stack: about 9 launches per drafted depth), or auto "
                               "(triton on cuda)", switch=True, choices=("auto", "triton", "torch"))
    gemv_backend: str = _opt("auto", "dense linear layers at decode (1-16 rows, 16-bit weights with at least 2048 "
                             "outputs): triton (one GEMV launch streaming the weight, no split-K reduce; "
                             "kernels/gemv_triton.py, cuda only), torch (cuBLAS), or auto (triton on cuda: with merged "
                             "linears the real-width KKKM decode step took 1.510 / 3.81 / 5.52 ms at batch 1 / 8 / "
                             "16 against cuBLAS's 1.549 / 3.83 / 5.54 ms on an H200, BENCHMARKS.md fourteenth "
                             "session)", switch=True, choices=("auto", "triton", "torch"))
    pdl: str = _opt("auto", "programmatic dependent launch between our kernels of a step (the Triton one-row GEMV, "
                    "norms, mHC weights / collapse / expand, SwiGLU, KDA conv and gate, MoE routing: "
                    "kernels/pdl_triton.py; the FP8 / NVFP4 GEMV at 2-8 rows: kernels/mma_gemv.py): a kernel's "
                    "blocks are scheduled, and the GEMVs' first weight tiles load, while the kernel before it "
                    "finishes; outputs unchanged. on (a CUDA device of sm_90 or later, with Triton), off, or auto "
                    "(on where supported: on an H200 real-width KKKMKKKM decoded a batch of 1 in 2.084-2.088 "
                    "instead of 2.178-2.185 ms a step with NVFP4 experts, a batch of 2 in 2.400-2.403 instead of "
                    "2.511-2.512 ms with FP8 linears, BENCHMARKS.md twenty-sixth session)",
                    switch=True, choices=("auto", "on", "off"))
    act_backend: str = _opt("auto", "the clamped SwiGLU of the dense MLPs, shared experts and grouped routed "
                            "experts: triton (one kernel, cuda only), torch (four ops), or auto (triton on cuda)",
                            switch=True,
                            choices=("auto", "triton", "torch"))
    moe_backend: str = _opt("auto", "routed experts: triton (grouped GEMMs over tokens sorted by expert, no host "
                            "sync; cuda only, forwards of at most --moe-triton-max-tokens tokens), torch (a "
                            "loop over the chosen experts), or auto (triton on cuda)", switch=True,
                            choices=("auto", "triton", "torch"))
    quant_decode_backend: str = _opt("auto", "how the grouped Triton experts turn FP8 / NVFP4 weights into bf16 "
                                     "tiles: qtile (kernels/qtile.py: two values per 32-bit operation in inline "
                                     "PTX, the tile as the tensor cores' A operand), qtile-b (the same decode, the "
                                     "tile as their B operand), element (each weight decoded on its own in float32), "
                                     "or auto (qtile-b on cuda unless the dtype is float16: an MoE layer at 1 "
                                     "token on an H200 took 78 instead of 303 us in NVFP4, 82 instead of 121 us "
                                     "in FP8, BENCHMARKS.md seventeenth session)",
                                     switch=True, choices=("auto", "qtile", "qtile-b", "element"))
    quant_gemv_backend: str = _opt("auto", "FP8 block-128 and NVFP4 linear layers and NVFP4 experts at decode: cuda "
                                   "(compiled by NVRTC at first use: kernels/mma_gemv.py at 2-8 bf16 rows, each lane "
                                   "loading its weights straight into the tensor cores' operands; kernels/nvfp4_m1.py "
                                   "for one NVFP4 row and, with the Triton MoE, for NVFP4 experts at up to 8 tokens, "
                                   "scale groups in the MMA's columns), triton (kernels/quant_gemv.py and the grouped "
                                   "Triton experts), or auto (cuda where NVRTC builds it, else triton: on an H200 at "
                                   "8 rows FP8 14.4 / 15.1 us against Triton's 19.6 / 23.5 us, NVFP4 14.1 / 17.6 "
                                   "against 19.7 / 22.3 us, on 12288 x 4096 / 4096 x 12288, BENCHMARKS.md "
                                   "twenty-third session; an NVFP4 MoE layer at 8 tokens 254 against 397 us, "
                                   "twenty-fourth)",
                                   switch=True, choices=("auto", "cuda", "triton"))
    moe_route_backend: str = _opt("auto", "MoE routing (sigmoid, bias, top-k, normalise), the experts' "
                                  "token-sorted layout and the sum of each token's k expert outputs: triton (one "
                                  "kernel each, cuda only; group-limited routing, n_group > 1, keeps torch), torch "
                                  "(plain ops, about 33 kernels per MoE layer), or auto (triton on cuda)",
                                  switch=True, choices=("auto", "triton", "torch"))
    indexer_topk_backend: str = _opt("auto", "the indexer's top-k pools of decode / verify tokens (with "
                                     "--indexer-backend triton): triton (kernels that sort only the pools "
                                     "complete at each token's position, in parallel chunks when the block table "
                                     "addresses more than 1,024 pools; cuda only), torch (torch.topk over every "
                                     "pool the block table addresses: 8,192 at 131,072 positions), or auto "
                                     "(triton with --indexer-backend triton). On an H200 triton took 12-13 us per "
                                     "call up to 16k-token contexts and 24-26 us at 64k / 128k, torch 29-54 us "
                                     "(BENCHMARKS.md, fourteenth session)", switch=True,
                                     choices=("auto", "triton", "torch"))
    indexer_backend: str = _opt("auto", "the DSA indexer's pool compression (every completed pool: softmax of the "
                                "gates over the pool, weighted sum of the keys), the decode / verify tokens' pool "
                                "scores (read from the paged pool cache in place) and their selection's positions: "
                                "triton (one kernel each, cuda only), torch (25 ops per MLA layer and 39 per step in "
                                "float32, bench/op_sites.py), or auto (triton on cuda)",
                                switch=True,
                                choices=("auto", "triton", "torch"))
    mla_decode_backend: str = _opt("auto", "sparse MLA of decode / verify tokens (and sparse prefill queries) over "
                                   "the indexer's selected latent rows: triton (the paged cache read in place, an "
                                   "online softmax split over the selection; cuda only), torch (a gather of the "
                                   "selected rows, 18 ops per MLA layer in float32), or auto (triton on cuda)",
                                   switch=True, choices=("auto", "triton", "torch"))
    moe_triton_max_tokens: int = _opt(2048, "largest forward (tokens) that takes the triton MoE (it needs a "
                                      "tokens x top-k x hidden fp32 buffer: 268 MB at 2048); longer bf16/fp16 "
                                      "ones take torch grouped_mm (no loop)", switch=True)
    sequence_parallel: bool = _opt(True, "split the residual stream across ranks for forwards of "
                                   "at least --sp-min-tokens tokens (TP>1 only)", switch=True,
                                   flag="--sp")
    sp_min_tokens: int = _opt(1024, "token count from which sequence parallelism is used",
                              switch=True)
    custom_allreduce: bool = _opt(True, "workspace all-reduce / all-gather / reduce-scatter over "
                                  "peer memory where the size table says it wins", switch=True)
    allreduce_workspace_mb: int = _opt(8, "per-rank workspace of the custom collectives (MiB)",
                                       switch=True)
    collective_table: str | None = _opt(None, "size table JSON from `tpserve tune collectives` "
                                        "(default: the tuned cache, else the shipped table)",
                                        switch=True)
    allreduce_topology: str = _opt("mesh", "workspace all-reduce topology: mesh (every rank reads every "
                                   "peer) or ring (neighbours only, for boxes linked in a ring; "
                                   "bitwise the same sums; cpu shared memory or cuda peer memory, "
                                   "any world size; all-gather / reduce-scatter then use the "
                                   "process group, the fused collectives their separate ops)",
                                   switch=True, choices=("mesh", "ring"))
    fused_collectives: bool = _opt(True, "fuse each block's all-reduce with the mHC expand that follows it (TP>1, "
                                   "steps without sequence parallelism: decode steps, prefills shorter than "
                                   "--sp-min-tokens): one kernel on cuda where the workspace serves the all-reduce "
                                   "in one round, the same two ops (bit for bit) elsewhere; and, with sequence "
                                   "parallelism, fold the MoE combine of the grouped experts (16-bit, unquantized) "
                                   "into the reduce-scatter that follows it: the combined rows computed straight "
                                   "into the workspace (cpu or cuda, at any size the workspace serves), the combine "
                                   "then the reduce-scatter (bit for bit) elsewhere; a size table rule \"unfused\" "
                                   "(`tpserve tune collectives` writes one where the separate ops measure faster) "
                                   "keeps either fold off at that size",
                                   switch=True)
    speculative_config: str | None = _opt(
        None, "speculative decoding, as JSON (vLLM's keys): {\"method\": \"mtp\", \"num_speculative_tokens\": 3} "
        "drafts with the checkpoint's MTP layer and verifies the drafts in one step; keys adaptive (true: k per "
        "step from measured acceptance and step cost) and truncate_threshold (0: off; t > 0 stops drafting a "
        "request when its predicted survival falls below t). Off by default", switch=True)
    hf_overrides: str | None = _opt(
        None, "model config fields to override, as JSON (vLLM's name), e.g. {\"num_hidden_layers\": 8} runs the "
        "checkpoint's first 8 layers (benchmarks of a model that does not fit); printed at start")
    # ---- weights: quantization and snapshots (model/quant.py, model/snapshot.py) ----
    quantization: str | None = _opt(None, "quantization method (vLLM's name): fp8 (block-wise), nvfp4 / modelopt_fp4, "
                                    "or none; default: what the checkpoint's quantization_config says")
    dense_fp8: bool = _opt(False, "convert a bf16 checkpoint's dense linears to FP8 at load (per-channel scales, "
                           "W8A16 GEMMs)", switch=True)
    snapshot: bool | None = _opt(None, "processed-weight snapshots: restore them, or write them on first boot "
                                 "(default: on for cuda, off on cpu)", switch=True)
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
                                      # (0.3 cost the adaptive mode ~8% at batch 1: BENCHMARKS.md, bench/spec_ab.py)

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
