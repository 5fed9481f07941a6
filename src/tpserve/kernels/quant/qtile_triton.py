"""Quantized weight tiles decoded to bf16 for tl.dot, two values per 32-bit operation (Triton helpers).

Why: at decode the quantized kernels are bound by instruction issue, not by bytes: an SM issues 128
lane-operations per clock, so a few operations per weight cost as much as NVFP4's bytes take to stream. One
code at a time in float32 (gemv_triton's `fp32_decode`: shifts, masks, an FMA and a group sum) spends ~6
operations per code; Triton's own e4m3 -> bf16 goes through an F2F per value, a quarter-rate pipe.

How (NVFP4, `nvfp4_tile`): the packed weight is read as 16-bit words (four codes, k = 4i + j in nibble
j). Two words sit in one 32-bit register, so nibble j of both is at the same bit offset of each half,
and shifts and masks on the 32-bit register decode both at once into a bf16x2 pair: the code's sign to
bit 15, its three magnitude bits (e1 e0 m) to bits 8..6. Those bits are exactly the e2m1 value times
2^-126 (code 1, the value 0.5, is a bf16 subnormal). One bf16x2 FMA (with -0, so signs and zeros stay
exact) applies the block scale, passed as bf16(s * 2^118): s is an e4m3 value (4 significant bits, at
most 448 < 2^9) so the scale is exact and below 2^127, and the product, v * s * 2^-8, has at most 6
significant bits and lies in [2^-20, 11]: exact in bf16. The caller multiplies its fp32 accumulator by
2^8 times the global scale. About 2.5 operations per code (SASS: 4 per code in the whole loop).
FP8 (`fp8_tile`): the same with bytes: e4m3's sign to bit 15 and its 7 other bits to bits 10..4 are
its value times 2^-120 (subnormals included), and a bf16x2 multiply by 2^120 gives it back exactly.

Pair order: a 32-bit result holds the same code of two adjacent words, i.e. columns k and k + 4
(NVFP4) or k and k + 2 (FP8). The tensor cores' A operand wants column pairs (2c, 2c + 1) in one
register, so the tiles come out with their columns permuted to put those two side by side
(`pair_order` / `fp8_pair_order` put the activations in the same order; a dot does not care about
the order of K, and both permutations only relabel each thread's registers). The callers use the
tile as A (W @ X^T), or, with PAIR=False (k order), as B (X @ W^T; the decoded pairs then pass through byte
permutes and register moves).

`ASM=True`: the decode in inline PTX (CUDA only); ASM=False computes the same bf16 bits with ordinary
Triton arithmetic (float32 bit tricks, then exact products rounded to bf16), for the CPU interpreter
and as the check of the PTX path (bench/quant_kernels.py compares the two bit for bit on the GPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

SCALE_BIAS = tl.constexpr(2.0**118)  # block scales are passed as bf16(s * 2^118); products carry 2^-8
OUT_BIAS = tl.constexpr(256.0)  # ... which the caller's accumulator gives back (times the global scale)


def _decode_ptx(mag_at: int, dtype: str) -> str:
    """PTX: out_j (j = nibble 0..3 of each 16-bit half of $4) = (sign << 15 | magnitude << mag_at) * $5 - 0,
    in dtype x2 (bf16: magnitude at bits 8..6; f16: at 11..9)."""
    mask = (7 << mag_at) | (7 << (mag_at + 16))
    out = ["", "{", ".reg .b32 a, b, z;", "mov.b32 z, 0x80008000;"]
    for j in range(4):
        d, sd = mag_at - 4 * j, 12 - 4 * j  # shifts bringing code j's magnitude and sign into place
        a = f"shl.b32 a, $4, {d};" if d > 0 else f"shr.b32 a, $4, {-d};"
        if sd:
            out += [a, f"shl.b32 b, $4, {sd};", f"and.b32 a, a, 0x{mask:08X};", "and.b32 b, b, 0x80008000;"]
        else:
            out += [a, f"and.b32 a, a, 0x{mask:08X};", "and.b32 b, $4, 0x80008000;"]
        out += ["or.b32 a, a, b;", f"fma.rn.{dtype}x2 ${j}, a, $5, z;"]
    return "\n".join(out + ["}", ""])


_DECODE_PTX = tl.constexpr(_decode_ptx(6, "bf16"))


F16_OUT_BIAS = tl.constexpr(16384.0)  # nvfp4_codes(F16=True): the codes come out times 2^-14 (and their scale)
F16_SCALE_BIAS = tl.constexpr(2.0**112)  # its plain-Triton form: v 2^-126 s 2^112 = v s 2^-14, exact in float16

# The same in float16 (nvfp4_codes with F16): sign to bit 15, magnitude to bits 11..9 are the e2m1 value times
# 2^-14 (code 1 a float16 subnormal); $5 the block scale as float16 (e4m3 is exact in it): products v * s * 2^-14
# lie in [2^-24, 0.17] with at most 6 significant bits, exact in float16.
_DECODE_F16_PTX = tl.constexpr(_decode_ptx(9, "f16"))


@triton.jit
def _nibble_value(w, scale, J: tl.constexpr, DTYPE: tl.constexpr = tl.bfloat16):
    """bf16 (or DTYPE) of (code j of the 16-bit words w (int32)) * 2^-126 * scale (fp32, = s * 2^118): exact."""
    c = (w >> (4 * J)) & 15
    v = (((c & 8) << 28) | ((c & 7) << 22)).to(tl.float32, bitcast=True)
    return (v * scale).to(DTYPE)


@triton.jit
def nvfp4_codes(w_ptr, s_ptr, n64, n_ok, k0, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                ASM: tl.constexpr, F16: tl.constexpr = False):
    """Four bf16 [BLOCK_N, BLOCK_K / 16, 2, 2] (o0, o1, o2, o3): o_j[n, g, p, q] = W[n, k] times its block
    scale and 2^-8 (no global scale), k = k0 + 16 g + 8 p + 4 q + j: code j of word 2 p + q of each
    16-code group, as the PTX decodes them (two words of a 32-bit register at once). F16: float16 values
    times 2^-14 instead (F16_OUT_BIAS gives it back; float16 widens to float32 on the FMA pipe, bf16 through
    integer shifts and byte permutes).
    w_ptr: the packed weight viewed as int16 [N, K/4] (the host passes .view(torch.int16) of the
    uint8 [N, K/2], low nibble = even k); s_ptr: float8_e4m3fn [N, K/16]; n64: the tile's rows
    (int64, masked by n_ok); K and BLOCK_K multiples of 16; columns past K read as 0."""
    G: tl.constexpr = BLOCK_K // 16
    i = tl.arange(0, BLOCK_K // 4)
    wi = k0 // 4 + i
    words = tl.load(w_ptr + n64[:, None] * (K // 4) + wi[None, :], mask=n_ok[:, None] & (wi < K // 4)[None, :],
                    other=0)
    g = k0 // 16 + tl.arange(0, G)
    sc = tl.load(s_ptr + n64[:, None] * (K // 16) + g[None, :], mask=n_ok[:, None] & (g < K // 16)[None, :],
                 other=0.0).to(tl.float32)
    words = tl.reshape(words, (BLOCK_N, G, 2, 2))  # word 2 p + q of each 16-code group
    return nvfp4_planes(words, sc[:, :, None, None], ASM, F16)


@triton.jit
def nvfp4_planes(words, sc, ASM: tl.constexpr, F16: tl.constexpr = False):
    """The four nibble planes of 16-bit words (int16, any shape): o_j = code j of each word times its block scale
    sc (float32, the words' shape or broadcast to it) and 2^-8, bf16 (F16: float16, times 2^-14); elementwise,
    two words per 32-bit operation where the words lie in pairs in a thread's registers."""
    if F16:
        if ASM:
            o0, o1, o2, o3 = tl.inline_asm_elementwise(
                _DECODE_F16_PTX, "=r,=r,=r,=r,r,r", [words, sc.to(tl.float16)],
                dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=2)
        else:
            w32 = words.to(tl.int32)
            sc = sc * F16_SCALE_BIAS
            o0 = _nibble_value(w32, sc, 0, tl.float16)
            o1 = _nibble_value(w32, sc, 1, tl.float16)
            o2 = _nibble_value(w32, sc, 2, tl.float16)
            o3 = _nibble_value(w32, sc, 3, tl.float16)
    elif ASM:
        o0, o1, o2, o3 = tl.inline_asm_elementwise(
            _DECODE_PTX, "=r,=r,=r,=r,r,r", [words, (sc * SCALE_BIAS).to(tl.bfloat16)],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
    else:
        w32 = words.to(tl.int32)
        sc = sc * SCALE_BIAS
        o0 = _nibble_value(w32, sc, 0)
        o1 = _nibble_value(w32, sc, 1)
        o2 = _nibble_value(w32, sc, 2)
        o3 = _nibble_value(w32, sc, 3)
    return o0, o1, o2, o3


@triton.jit
def nvfp4_tile(w_ptr, s_ptr, n64, n_ok, k0, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               ASM: tl.constexpr, PAIR: tl.constexpr = True):
    """bf16 [BLOCK_N, BLOCK_K]: W[n, k0:k0 + BLOCK_K] with its block scales, times 2^-8 (no global
    scale), its columns in *pair order* (pair_order below: the activations' tile must be put in the
    same order before the dot), or in k order with PAIR=False (for the tile as the MMA's B operand).
    Arguments as in nvfp4_codes."""
    o0, o1, o2, o3 = nvfp4_codes(w_ptr, s_ptr, n64, n_ok, k0, K, BLOCK_N, BLOCK_K, ASM)
    # [N, G, p, q, a, b] holds code j = 2 a + b of word 2 p + q (k = 16 g + 8 p + 4 q + j); put q last,
    # so the two words of one 32-bit register (one PTX output) stay adjacent: the MMA's k pairs
    t = tl.join(tl.join(o0, o2), tl.join(o1, o3))
    if PAIR:
        t = tl.permute(t, (0, 1, 2, 4, 5, 3))
    return tl.reshape(t, (BLOCK_N, BLOCK_K))


@triton.jit
def pair_order(x, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [ROWS, BLOCK_K] (k = 16 g + 8 p + 4 q + j) with its columns in nvfp4_tile's order
    (16 g + 8 p + 2 j + q): a permutation of each thread's registers, no data movement."""
    x = tl.reshape(x, (ROWS, BLOCK_K // 16, 2, 2, 4))
    return tl.reshape(tl.permute(x, (0, 1, 2, 4, 3)), (ROWS, BLOCK_K))


F8_BIAS = tl.constexpr(2.0**120)
# out0 / out1 = the low / high byte of each 16-bit half of $2 as bf16x2 (sign << 15 | rest << 4) * 2^120
_FP8_PTX = tl.constexpr("""
{
.reg .b32 a, b, c, z;
mov.b32 c, 0x7B807B80;
mov.b32 z, 0x80008000;
shl.b32 a, $2, 8;
shl.b32 b, $2, 4;
and.b32 a, a, 0x80008000;
and.b32 b, b, 0x07F007F0;
or.b32 a, a, b;
fma.rn.bf16x2 $0, a, c, z;
shr.b32 b, $2, 4;
and.b32 a, $2, 0x80008000;
and.b32 b, b, 0x07F007F0;
or.b32 a, a, b;
fma.rn.bf16x2 $1, a, c, z;
}
""")


@triton.jit
def _byte_bf16(w, J: tl.constexpr):
    """bf16 of the e4m3 byte j of the 16-bit words w (int32), via float32 bits (value * 2^-120) * 2^120."""
    b = (w >> (8 * J)) & 255
    return ((((b & 128) << 24) | ((b & 127) << 20)).to(tl.float32, bitcast=True) * F8_BIAS).to(tl.bfloat16)


@triton.jit
def fp8_tile(w_ptr, n64, n_ok, k0, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
             PAIR: tl.constexpr = True):
    """bf16 [BLOCK_N, BLOCK_K]: the e4m3 values W[n, k0:k0 + BLOCK_K] (no scale; e4m3's NaN codes
    come out finite), columns in fp8_pair_order (k order with PAIR=False). w_ptr: the float8_e4m3fn
    [N, K] weight viewed as int16 [N, K/2]; K and BLOCK_K even; columns past K read as 0."""
    i = tl.arange(0, BLOCK_K // 2)
    wi = k0 // 2 + i
    words = tl.load(w_ptr + n64[:, None] * (K // 2) + wi[None, :], mask=n_ok[:, None] & (wi < K // 2)[None, :],
                    other=0)
    words = tl.reshape(words, (BLOCK_N, BLOCK_K // 4, 2))  # word 2 p + q covers k = 4 p + 2 q + j
    if ASM:
        lo, hi = tl.inline_asm_elementwise(_FP8_PTX, "=r,=r,r", [words], dtype=(tl.bfloat16, tl.bfloat16),
                                           is_pure=True, pack=2)
    else:
        w32 = words.to(tl.int32)
        lo = _byte_bf16(w32, 0)
        hi = _byte_bf16(w32, 1)
    t = tl.join(lo, hi)  # [N, p, q, j]
    if PAIR:  # -> [N, p, j, q]: the two words of one register side by side
        t = tl.permute(t, (0, 1, 3, 2))
    return tl.reshape(t, (BLOCK_N, BLOCK_K))


@triton.jit
def fp8_pair_order(x, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [ROWS, BLOCK_K] with its columns in fp8_tile's order (k = 4 p + 2 q + j at 4 p + 2 j + q)."""
    x = tl.reshape(x, (ROWS, BLOCK_K // 4, 2, 2))
    return tl.reshape(tl.permute(x, (0, 1, 3, 2)), (ROWS, BLOCK_K))
