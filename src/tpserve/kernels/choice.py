"""The kernel switches of one rank (`Kernels`, resolved into ops by registry.py) and the weight options."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightOptions:
    """How weights are processed at load (model/build.py): quantization override, --dense-fp8, snapshots."""

    quantization: str | None = None   # None: what the checkpoint says
    dense_fp8: bool = False
    snapshot: bool = False            # read / write processed-weight snapshots
    snapshot_dir: str | None = None   # default: <cache dir>/snapshots
    gpu_memory_utilization: float = 0.85  # for the start-up memory plan (model/plan.py)
    block_size: int = 64
    merge_linears: bool = True         # model/merged.py: linears that share an input as one GEMM


@dataclass(frozen=True)
class Kernels:
    """The switches (EngineConfig's, resolved for the device by engine/setup.py): registry.resolve turns them into
    the ops a model runs. A backend switch names an op's implementation: "torch" its torch form, "triton" /
    "fla" / "cuda" a fast one (the ops each switch picks: the subjects' ops.py and quant/dispatch.py)."""

    kda: str = "torch"            # "fla": fla-core's Triton kernels; "torch": our chunked / recurrent forms
    kda_chunk_indices: str = "host"  # "device": fla-core builds chunk_kda's chunk indices on the device (use_graph)
    kda_short_prefill: int = 0    # fla: prefill sequences of at most this many tokens through the recurrent kernel
    kda_prep: str = "torch"       # "triton": KDA short conv (decode / verify rows), forget gate, beta in Triton
    mhc: str = "torch"            # "triton": one fused kernel for the mHC weights; "torch": plain ops
    mhc_project: str = "torch"    # "triton": prefill steps' mHC stream norm + projection as one kernel (bf16, cuda)
    norm: str = "torch"           # "triton": fused norms and mHC collapse / expand (norms/norm_triton.py)
    moe: str = "torch"            # "triton": grouped expert GEMMs; "torch": a loop over the chosen experts
    moe_triton_max_tokens: int = 0  # the triton MoE runs forwards of at most this many tokens
    act: str = "torch"            # "triton": the dense MLPs' clamped SwiGLU in one kernel
    gemv: str = "torch"           # "triton": dense linears of 1-16 rows as one GEMV launch (linear/gemv_triton.py)
    moe_route: str = "torch"      # "triton": router top-k and the experts' sorted layout one kernel each
    quant_decode: str = "element"  # "qtile" / "qtile-b": the Triton NVFP4 experts decode tiles with
    # quant/qtile_triton.py, the tile as the tensor cores' A / B operand
    quant_decode_fp8: str = "element"  # the same for FP8 experts
    quant_gemv: str = "triton"    # "cuda": FP8 / NVFP4 linears at decode through quant/gemv_cuda.py and
    # quant/nvfp4_m1_cuda.py (NVRTC); with moe "triton" the NVFP4 experts at up to dispatch.M1_MAX_TOKENS tokens too
    indexer: str = "torch"        # "triton": the indexer's pool compression, decode scores, selection: a kernel each
    indexer_topk: str = "torch"   # "triton" (with indexer "triton"): decode top-k over complete pools only
    mla_decode: str = "torch"     # "triton": sparse MLA over the paged latent cache (attention/mla_triton.py)
    mla_prefill: str = "auto"     # "sparse": each query attends its selected rows only; "dense": masked SDPA; "auto":
    # sparse from model/mla.SPARSE_PREFILL_FROM positions
    prefill_together: bool = True  # model/mla.py, model/indexer.py: a step's prefill sequences in one call
    argmax: str = "torch"         # "triton": the drafter's argmax and its probability in one kernel per call
    pdl: bool = False             # programmatic dependent launch between our kernels (launch/pdl_triton.py)
    fused_collectives: bool = True  # TP > 1: all-reduce + mHC expand as one Communicator call; with SP, the
    # MoE combine inside the reduce-scatter (Communicator.reduce_scatter_moe_combine)
    weights: WeightOptions = WeightOptions()

    def describe(self) -> str:
        moe = f"triton up to {self.moe_triton_max_tokens} tokens" if self.moe == "triton" else self.moe
        kda = f"fla, recurrent prefill up to {self.kda_short_prefill} tokens" if (
            self.kda == "fla" and self.kda_short_prefill) else self.kda
        return (f"kda={kda}, kda_prep={self.kda_prep}, mhc={self.mhc}, mhc_project={self.mhc_project}, "
                f"norm={self.norm}, act={self.act}, "
                f"gemv={self.gemv}, moe={moe}, moe_route={self.moe_route}, quant_decode={self.quant_decode} "
                f"(fp8 {self.quant_decode_fp8}), quant_gemv={self.quant_gemv}, "
                f"indexer={self.indexer}, "
                f"indexer_topk={self.indexer_topk}, mla_decode={self.mla_decode}, mla_prefill={self.mla_prefill}, "
                f"prefill_together={'on' if self.prefill_together else 'off'}, pdl={'on' if self.pdl else 'off'}")
