#!/usr/bin/env python3
"""Pure-Python reference of the quantized checkpoint formats (no numpy): an independent
implementation of the quantization math `scr quantize` claims to mirror, and of dequantization.

Rules (docs/QUANT.md):
  * every float tensor is rounded to bf16 first; each arithmetic op then runs in bf16 the way MLX's
    and torch's CPU ops do for bf16 tensors: exact result rounded to f32, then to bf16 (ties to even);
  * MLX affine (ml-explore/mlx mlx/ops.cpp affine_quantize, CPU fallback), per group of G:
      scale = max((w_max - w_min) / 15, 1e-7), negative unless |w_min| > |w_max|;
      edge = w_min if |w_min| > |w_max| else w_max; q0 = round(edge / scale);
      scale = edge / q0 and bias = edge when q0 != 0, else bias = 0;
      q = clip(round((w - bias) / scale), 0, 15); 8 values per uint32, element 0 in the low bits;
  * compressed-tensors symmetric (calculate_qparams): scale = max|w| / 127.5 (int8) or / 448 (fp8),
    at least f32 eps; int8 q = clip(round(w / scale), -128, 127); fp8 q = e4m3(clip(w / scale, +-448)).
  * dequantized: MLX w = f32(scale * q + bias); compressed-tensors w = f32(scale * q).
"""
import json
import math
import struct
import bisect

DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "U32": 4, "I8": 1, "F8_E4M3": 1, "U8": 1}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], list(t["shape"]), data[base + b:base + e])
    return out


def write_safetensors(path, tensors):
    """tensors: dict name -> (dtype, shape, bytes)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def bf16_value(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def bf(x):
    """One bf16 op: the exact result (a Python double is exact or correctly rounded for one op of
    f32 operands) rounded to f32, then to bf16."""
    return bf16_value(bf16_bits(f32(x)))


def f16_value(bits):
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def floats(dtype, raw):
    n = len(raw) // DTYPE_BYTES[dtype]
    if dtype == "F32":
        return list(struct.unpack("<%df" % n, raw))
    if dtype == "BF16":
        return [bf16_value(b) for b in struct.unpack("<%dH" % n, raw)]
    if dtype == "F16":
        return [f16_value(b) for b in struct.unpack("<%dH" % n, raw)]
    raise ValueError(dtype)


def bf16_bytes(values):
    return struct.pack("<%dH" % len(values), *[bf16_bits(v) for v in values])


def f32_bytes(values):
    return struct.pack("<%df" % len(values), *values)


def round_half_even(x):
    return float(round(x))  # Python's round() is half to even


# --- fp8 e4m3fn: every finite value by enumeration; encoding = nearest, ties to the even code ---
def e4m3_decode(code):
    s = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return s * m / 8.0 * 2.0 ** -6
    return s * (1 + m / 8.0) * 2.0 ** (e - 7)


_POS = [(e4m3_decode(c), c) for c in range(0x7F)]  # 0 .. 448, increasing with the code
_POS_VALUES = [v for v, _ in _POS]


def e4m3_encode(x):
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = min(abs(x), 448.0)
    i = bisect.bisect_left(_POS_VALUES, a)
    if i < len(_POS) and _POS_VALUES[i] == a:
        return sign | _POS[i][1]
    lo, hi = _POS[i - 1], _POS[i]
    dlo, dhi = a - lo[0], hi[0] - a
    if dlo < dhi or (dlo == dhi and lo[1] % 2 == 0):
        return sign | lo[1]
    return sign | hi[1]


# --- quantizers (inputs already bf16 values) ---
def mlx_group(w, bits=4):
    top = float((1 << bits) - 1)
    w_max, w_min = max(w), min(w)
    mask = abs(w_min) > abs(w_max)
    scale = max(bf(bf(w_max - w_min) / top), bf(1e-7))
    if not mask:
        scale = -scale
    edge = w_min if mask else w_max
    q0 = round_half_even(bf(edge / scale))
    if q0 != 0:
        scale = bf(edge / q0)
    bias = edge if q0 != 0 else 0.0
    q = [int(min(max(round_half_even(bf(bf(v - bias) / scale)), 0.0), top)) for v in w]
    return q, scale, bias


def mlx_quantize(w, n, k, g, bits=4):
    """MLX affine quantization of an [n, k] bf16 matrix: (uint32 words, scales, biases), element 0
    of each word in its low bits (bits 4 or 8: 8 or 4 elements per word)."""
    per = 32 // bits
    words, scales, biases = [], [], []
    for r in range(n):
        row_q = []
        for gi in range(k // g):
            q, s, b = mlx_group(w[r * k + gi * g:r * k + (gi + 1) * g], bits)
            row_q += q
            scales.append(s)
            biases.append(b)
        for i in range(0, k, per):
            word = 0
            for j in range(per):
                word |= row_q[i + j] << (bits * j)
            words.append(word)
    return words, scales, biases


def mlx_dequantize(words, scales, biases, n, k, g, bits):
    """The f32 values of an MLX affine matrix: f32(scale * q + bias) per element, in float64 first."""
    per, mask = 32 // bits, (1 << bits) - 1
    return [f32(scales[r * (k // g) + c // g] * ((words[r * (k // per) + c // per] >> (bits * (c % per))) & mask)
                + biases[r * (k // g) + c // g]) for r in range(n) for c in range(k)]


def symmetric_scale(w, half):
    return max(bf(max(abs(v) for v in w) / half), bf(2.0 ** -23))


def int8_quantize(w, n, k):
    q, scales = [], []
    for r in range(n):
        row = w[r * k:(r + 1) * k]
        s = symmetric_scale(row, 127.5)
        scales.append(s)
        q += [int(min(max(round_half_even(bf(v / s)), -128.0), 127.0)) for v in row]
    return q, scales


def fp8_quantize(w, n, k, per_tensor):
    q, scales = [], []
    if per_tensor:
        scales = [symmetric_scale(w, 448.0)]
    for r in range(n):
        row = w[r * k:(r + 1) * k]
        s = scales[0] if per_tensor else symmetric_scale(row, 448.0)
        if not per_tensor:
            scales.append(s)
        q += [e4m3_encode(min(max(bf(v / s), -448.0), 448.0)) for v in row]
    return q, scales


# --- dequantization of a written checkpoint ---
def dequantize_checkpoint(tensors):
    """Quantized safetensors dict -> dict of F32 tensors (dense names), the reference weights."""
    out = {}
    for name, (dtype, shape, raw) in tensors.items():
        if name.endswith((".scales", ".biases", ".weight_scale")):
            continue
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        if dtype == "U32":
            s = floats(*tensors[module + ".scales"][::2])
            b = floats(*tensors[module + ".biases"][::2])
            n, words = shape[0], shape[1]
            k = words * 8
            g = k // tensors[module + ".scales"][1][1]
            ws = struct.unpack("<%dI" % (n * words), raw)
            vals = []
            for r in range(n):
                for c in range(k):
                    q = (ws[r * words + c // 8] >> (4 * (c % 8))) & 15
                    gi = r * (k // g) + c // g
                    vals.append(f32(s[gi] * q + b[gi]))
            out[name] = ("F32", [n, k], f32_bytes(vals))
        elif dtype in ("I8", "F8_E4M3"):
            s = floats(*tensors[module + ".weight_scale"][::2])
            n, k = shape
            if dtype == "I8":
                qs = [float(v) for v in struct.unpack("<%db" % (n * k), raw)]
            else:
                qs = [e4m3_decode(v) for v in raw]
            vals = [f32(qs[i] * (s[0] if len(s) == 1 else s[i // k])) for i in range(n * k)]
            out[name] = ("F32", [n, k], f32_bytes(vals))
        else:
            out[name] = ("F32", shape, f32_bytes(floats(dtype, raw)))
    return out
