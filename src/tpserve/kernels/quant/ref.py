"""Reference (torch) quantize / dequantize for the weight layouts tpserve reads and writes, and the W8A8
blockwise torch._scaled_mm (sm90) quant/dispatch.py takes for FP8 prefill.

FP8 block (DeepSeek / GLM): float8_e4m3fn weight [N, K] and float32 `weight_scale_inv`
[ceil(N/B), ceil(K/B)]; w = q * scale_inv[n // B, k // B].
NVFP4 (NVIDIA ModelOpt): uint8 weight [N, K/2], two e2m1 codes per byte, low nibble first;
float8_e4m3fn `weight_scale` [N, K/16]; float32 `weight_scale_2` (a scalar);
w = e2m1(code) * weight_scale[n, k // 16] * weight_scale_2.
FP8 per-channel (--dense-fp8): float8_e4m3fn weight [N, K], float32 scale [N]; w = q * scale[n].
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FP4_MAX = 6.0
NVFP4_GROUP = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _blocks(n: int, b: int) -> int:
    return -(-n // b)


def fp8_block_quantize(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (float8_e4m3fn [N, K], float32 scale_inv [ceil(N/bn), ceil(K/bk)])."""
    bn, bk = block
    n, k = w.shape
    nb, kb = _blocks(n, bn), _blocks(k, bk)
    padded = torch.zeros(nb * bn, kb * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    tiles = padded.view(nb, bn, kb, bk)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(nb * bn, kb * bk)[:n, :k]
    return q.to(FP8).contiguous(), scale.contiguous()


def fp8_block_dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128),
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of fp8_block_quantize (exact: fp32 product of the stored values)."""
    bn, bk = block
    n, k = q.shape[-2:]
    s = scale_inv.float().repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]
    return (q.float() * s).to(dtype)


def fp8_channel_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (float8_e4m3fn [N, K], float32 scale [N]) with one scale per output row."""
    amax = w.float().abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX)
    return q.to(FP8), scale


def fp8_channel_dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() * scale.float()[..., None]).to(dtype)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (uint8 0..15, sign in bit 3) of each value of x (already scaled to [-6, 6])."""
    mids = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32, device=x.device)
    mag = torch.bucketize(x.float().abs().clamp(max=FP4_MAX), mids, right=False)
    sign = (x < 0).to(torch.uint8) << 3
    return mag.to(torch.uint8) | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=codes.device)
    return lut[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes, element 2i in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)


def nvfp4_quantize(w: torch.Tensor, global_amax: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] (K a multiple of 16) -> (uint8 [N, K/2], float8_e4m3fn weight_scale [N, K/16],
    float32 weight_scale_2 []), as NVIDIA ModelOpt writes them."""
    n, k = w.shape
    if k % NVFP4_GROUP:
        raise ValueError(f"nvfp4: the input dim ({k}) must be a multiple of {NVFP4_GROUP}")
    wf = w.float()
    amax = float(wf.abs().max()) if global_amax is None else float(global_amax)
    scale2 = torch.tensor(amax / (FP8_MAX * FP4_MAX) if amax > 0 else 1.0, dtype=torch.float32)
    groups = wf.view(n, k // NVFP4_GROUP, NVFP4_GROUP)
    block_scale = (groups.abs().amax(-1) / FP4_MAX / scale2).clamp(max=FP8_MAX).to(FP8)
    denom = block_scale.float() * scale2
    scaled = torch.where(denom[..., None] > 0, groups / denom[..., None].clamp(min=1e-30), torch.zeros_like(groups))
    codes = e2m1_encode(scaled.view(n, k))
    return pack_nibbles(codes), block_scale.contiguous(), scale2.to(w.device)


def nvfp4_dequantize(packed: torch.Tensor, block_scale: torch.Tensor, scale2: torch.Tensor,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of nvfp4_quantize; packed [..., N, K/2], block_scale [..., N, K/16], scale2 broadcastable
    to [..., N] (a scalar, or one value per row)."""
    vals = e2m1_decode(unpack_nibbles(packed))
    s = block_scale.float().repeat_interleave(NVFP4_GROUP, dim=-1)
    s2 = scale2.float()
    if s2.dim() and s2.shape[-1] == vals.shape[-2]:
        s2 = s2[..., None]
    return (vals * s * s2).to(dtype)


def w8a8_block_scaled_mm(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [M, K] 16-bit, w fp8 [N, K], s [N/128, K/128]: activations quantized per token x 128 columns, then
    torch._scaled_mm's DeepSeek-style blockwise FP8 GEMM (sm90), the scale layouts as DESIGN.md notes."""
    m, k = x.shape
    xb = x.float().view(m, k // 128, 128)
    amax = xb.abs().amax(-1).clamp(min=1e-12)
    sa = amax / FP8_MAX
    xq = (xb / sa[..., None]).clamp(-FP8_MAX, FP8_MAX).view(m, k).to(FP8)
    # scale_b: the [K/128, N/128] transpose of the weight's scales as a view (outer-dim-major), as DESIGN.md
    # notes: a contiguous copy is refused
    return torch._scaled_mm(xq, w.t(), scale_a=sa.t().contiguous().t(), scale_b=s.t(), out_dtype=x.dtype)
