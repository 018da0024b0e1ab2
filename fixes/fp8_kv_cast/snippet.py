# >>> perfscope fp8-kv-cast >>>
# Inserted by `perfscope fix fp8-kv-cast --apply`; `perfscope fix fp8-kv-cast --revert` restores
# the original file byte for byte. Design: fixes/fp8_kv_cast/README.md in perfscope.
#
# The attention kernels below read only the KV rows the batch references (its kv_indices / page
# table), yet the code used to convert the whole FP8 pool to BF16 every layer of every step. These
# helpers either hand the FP8 pool to a kernel that reads FP8 itself ("native": FlashInfer >= 0.6.14
# on SM90, planned with kv_data_type = the pool dtype) or convert only the referenced rows into a
# persistent BF16 scratch of the pool's shape ("pages"). Under CUDA graphs the row count is read on
# the GPU at replay time, so nothing about the batch is baked into the graph. Set
# PERFSCOPE_FP8_KV_CAST=off in the server's environment to get the original whole-pool cast back
# without editing this file.
import os as _perfscope_os

import torch as _perfscope_torch

_PERFSCOPE_FP8KV_SCRATCH = {}
_PERFSCOPE_FP8KV_FP8 = tuple(
    getattr(_perfscope_torch, _n) for _n in ("float8_e4m3fn", "float8_e5m2") if hasattr(_perfscope_torch, _n)
)


def _perfscope_fp8kv_enabled():
    return _perfscope_os.environ.get("PERFSCOPE_FP8_KV_CAST", "on").lower() not in ("off", "0", "false", "no")


def _perfscope_fp8kv_capturing(t):
    return t.is_cuda and _perfscope_torch.cuda.is_current_stream_capturing()


def _perfscope_fp8kv_plan_dtype(model_runner):
    """kv_data_type for plan(): the FP8 pool dtype where FlashInfer's MLA kernel reads FP8 KV with a
    BF16 query (SM90, FlashInfer >= 0.6.14), else the model dtype (then the pool is converted)."""
    q_dtype = model_runner.dtype
    kv_dtype = getattr(model_runner, "kv_cache_dtype", q_dtype)
    fp8 = getattr(_perfscope_torch, "float8_e4m3fn", None)
    if fp8 is None or kv_dtype != fp8 or q_dtype != _perfscope_torch.bfloat16 or not _perfscope_fp8kv_enabled():
        return q_dtype
    try:
        if not _perfscope_torch.cuda.is_available() or _perfscope_torch.cuda.get_device_capability()[0] != 9:
            return q_dtype
        import re as _re

        import flashinfer as _fi

        ver = tuple(int(x) for x in _re.findall(r"\d+", _fi.__version__)[:3])
    except Exception:
        return q_dtype
    return kv_dtype if ver >= (0, 6, 14) else q_dtype


def _perfscope_fp8kv_native(wrapper, pool):
    """True when ``wrapper`` was planned to read ``pool``'s own (FP8) dtype."""
    return pool.dtype in _PERFSCOPE_FP8KV_FP8 and getattr(wrapper, "_kv_data_type", None) == pool.dtype


def _perfscope_fp8kv_scales(wrapper, kv):
    """run() keyword arguments: FlashInfer requires unit scales for an FP8 KV cache (SGLang's MLA
    pool stores unscaled e4m3), and rejects them otherwise."""
    if _perfscope_fp8kv_native(wrapper, kv):
        return {"ckv_scale": 1.0, "kpe_scale": 1.0}
    return {}


def _perfscope_fp8kv_keep(buf, dtype, wrapper):
    """A buffer that is already compact (e.g. a DCP gather): no conversion when planned native."""
    if _perfscope_fp8kv_native(wrapper, buf):
        return buf
    return buf.to(dtype)


def _perfscope_fp8kv_scratch(pool, dtype):
    key = (str(pool.device), tuple(pool.shape), dtype)
    buf = _PERFSCOPE_FP8KV_SCRATCH.get(key)
    if buf is None:
        # One per pool shape, shared by all layers: the conversion and the kernel reading it are
        # issued back to back on one stream, so a layer never sees another layer's rows. Zeroed so
        # that rows no batch has referenced yet hold finite values. Its size is one layer of the
        # pool in `dtype`, which the whole-pool cast it replaces allocated every layer.
        buf = _perfscope_torch.zeros(pool.shape, dtype=dtype, device=pool.device)
        _PERFSCOPE_FP8KV_SCRATCH[key] = buf
    return buf


try:
    import triton as _perfscope_triton
    import triton.language as tl  # the name `tl`: Triton's interpreter patches it by name
except Exception:  # CPU-only installs: the torch path below is used
    _perfscope_triton = None

if _perfscope_triton is not None:

    @_perfscope_triton.jit
    def _perfscope_fp8kv_bits(b, FMT: tl.constexpr):
        # b: int32 holding one FP8 byte -> float32. Bit-exact, any GPU arch (no FP8 type needed).
        if FMT == 0:  # e4m3fn: s eeee mmm, bias 7, no inf, 0x7f / 0xff are NaN
            s = (b >> 7) & 1
            e = (b >> 3) & 15
            m = b & 7
            bits = (s << 31) | ((e + 120) << 23) | (m << 20)
            normal = bits.to(tl.uint32).to(tl.float32, bitcast=True)
            # subnormal (and zero): m * 2^-9 with the sign bit set by hand (negating gives +0.0 for
            # 0x80 on the GPU, where torch's cast gives -0.0)
            sub = (m.to(tl.float32) * 0.001953125).to(tl.uint32, bitcast=True) | (s << 31).to(tl.uint32)
            v = tl.where(e == 0, sub.to(tl.float32, bitcast=True), normal)
            v = tl.where((b & 127) == 127, float("nan"), v)
        else:  # e5m2 is the high byte of an IEEE half
            v = (b << 8).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        return v

    @_perfscope_triton.jit
    def _perfscope_fp8kv_rows_kernel(src, dst, idx, indptr, pos, n_rows, ROW: tl.constexpr,
                                     FMT: tl.constexpr, BLOCK_R: tl.constexpr,
                                     BLOCK_C: tl.constexpr):
        # dst[idx[r]] = convert(src[idx[r]]) for r < indptr[pos]; the bound is read here, on the
        # GPU, so a captured CUDA graph converts exactly the rows of each replayed batch.
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        n = tl.load(indptr + pos).to(tl.int32)
        for r0 in range(pid * BLOCK_R, n, nprog * BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            rm = r < n
            row = tl.load(idx + r, mask=rm, other=0).to(tl.int64)
            row = tl.minimum(tl.maximum(row, 0), n_rows - 1)
            for c0 in tl.static_range(0, ROW, BLOCK_C):
                c = c0 + tl.arange(0, BLOCK_C)
                m = rm[:, None] & (c[None, :] < ROW)
                off = row[:, None] * ROW + c[None, :]
                b = tl.load(src + off, mask=m, other=0).to(tl.int32)
                tl.store(dst + off, _perfscope_fp8kv_bits(b, FMT).to(dst.dtype.element_ty), mask=m)

    @_perfscope_triton.jit
    def _perfscope_fp8kv_pages_kernel(src, dst, page_table, pt_stride, seqlens, page_size, n_pages,
                                      PAGE: tl.constexpr, FMT: tl.constexpr,
                                      BLOCK_P: tl.constexpr):
        # Request b reads pages page_table[b, :cdiv(seqlens[b], page_size)]; a page is PAGE
        # contiguous elements of the pool (page_size tokens x one row).
        b = tl.program_id(0)
        ch = tl.program_id(1)
        nch = tl.num_programs(1)
        n = (tl.load(seqlens + b).to(tl.int32) + page_size - 1) // page_size
        for j in range(ch, n, nch):
            page = tl.load(page_table + b.to(tl.int64) * pt_stride + j).to(tl.int64)
            page = tl.minimum(tl.maximum(page, 0), n_pages - 1)
            for c0 in tl.static_range(0, PAGE, BLOCK_P):
                c = c0 + tl.arange(0, BLOCK_P)
                m = c < PAGE
                off = page * PAGE + c
                x = tl.load(src + off, mask=m, other=0).to(tl.int32)
                tl.store(dst + off, _perfscope_fp8kv_bits(x, FMT).to(dst.dtype.element_ty), mask=m)

else:
    _perfscope_fp8kv_rows_kernel = _perfscope_fp8kv_pages_kernel = None


def _perfscope_fp8kv_fmt(pool):
    return 0 if pool.dtype == getattr(_perfscope_torch, "float8_e4m3fn", None) else 1


def _perfscope_fp8kv_rows(pool, dtype, kv_indices, kv_indptr, pos):
    """``pool`` converted to ``dtype`` where it counts: the returned tensor has pool's shape, and
    its rows ``kv_indices[:kv_indptr[pos]]`` equal ``pool[rows].to(dtype)``; other rows are stale."""
    if pool.dtype == dtype or not _perfscope_fp8kv_enabled():
        return pool.to(dtype)
    if kv_indices is None or kv_indptr is None:
        return pool.to(dtype)
    n_rows = pool.shape[0]
    row = pool.numel() // max(n_rows, 1)
    if pool.is_cuda and pool.is_contiguous() and pool.dtype in _PERFSCOPE_FP8KV_FP8:
        if _perfscope_fp8kv_rows_kernel is not None:
            out = _perfscope_fp8kv_scratch(pool, dtype)
            sms = _perfscope_torch.cuda.get_device_properties(pool.device).multi_processor_count
            _perfscope_fp8kv_rows_kernel[(4 * sms,)](
                pool.view(_perfscope_torch.uint8), out, kv_indices, kv_indptr, pos, n_rows,
                ROW=row, FMT=_perfscope_fp8kv_fmt(pool), BLOCK_R=16, BLOCK_C=64,
            )
            return out
    if _perfscope_fp8kv_capturing(pool):
        return pool.to(dtype)  # no kernel to size the work on the GPU: keep the original cast
    n = int(kv_indptr[pos])  # host read: free on CPU; one sync on a GPU without Triton
    out = _perfscope_fp8kv_scratch(pool, dtype)
    idx = kv_indices[:n].to(device=pool.device, dtype=_perfscope_torch.long).clamp_(0, max(n_rows - 1, 0))
    out.view(n_rows, -1).index_copy_(0, idx, pool.reshape(n_rows, -1).index_select(0, idx).to(dtype))
    return out


def _perfscope_fp8kv_decode(pool, dtype, wrapper, kv_indptr, bs):
    """forward_decode: the decode wrapper reads kv_indices[:kv_indptr[bs]], with kv_indptr the
    backend's own buffer (the one the indices updater fills, also on CUDA-graph replay)."""
    if _perfscope_fp8kv_native(wrapper, pool):
        return pool
    if kv_indptr is None:  # no backend indptr (perfscope's repro server): as for an eager extend
        return _perfscope_fp8kv_extend(pool, dtype, wrapper)
    return _perfscope_fp8kv_rows(pool, dtype, getattr(wrapper, "_kv_indices_buf", None), kv_indptr, bs)


def _perfscope_fp8kv_extend(pool, dtype, wrapper):
    """forward_extend (paged prefill, verify, draft extend)."""
    if _perfscope_fp8kv_native(wrapper, pool):
        return pool
    if getattr(wrapper, "_use_cuda_graph", False) or _perfscope_fp8kv_capturing(pool):
        # Graph-captured extend (speculative verify / draft extend): some SGLang versions refresh
        # the wrapper's kv_indptr outside plan(), so its row count cannot be trusted at replay.
        return pool.to(dtype)
    indices = getattr(wrapper, "_kv_indices_buf", None)
    indptr = getattr(wrapper, "_kv_indptr_buf", None)
    if indices is None:
        return pool.to(dtype)
    if indptr is None:  # planned eagerly: the index list is exactly the referenced rows
        indptr = _perfscope_torch.tensor([0, indices.numel()], dtype=_perfscope_torch.int32, device=indices.device)
    return _perfscope_fp8kv_rows(pool, dtype, indices, indptr, indptr.numel() - 1)


def _perfscope_fp8kv_paged(pool, dtype, page_table, seqlens, page_size, fallback=False):
    """fa3 (flash_attn_with_kvcache): request b reads pages page_table[b, :cdiv(seqlens[b],
    page_size)] of the pool viewed as [pages, page_size, ...]."""
    if pool.dtype == dtype or fallback or not _perfscope_fp8kv_enabled():
        return pool.to(dtype)
    page_size = int(page_size)
    n_pages = pool.shape[0] // page_size
    page = pool.numel() // max(n_pages, 1)
    if pool.is_cuda and pool.is_contiguous() and pool.dtype in _PERFSCOPE_FP8KV_FP8 and pool.shape[0] % page_size == 0:
        if _perfscope_fp8kv_pages_kernel is not None:
            out = _perfscope_fp8kv_scratch(pool, dtype)
            bs = page_table.shape[0]
            _perfscope_fp8kv_pages_kernel[(bs, 16)](
                pool.view(_perfscope_torch.uint8), out, page_table, page_table.stride(0), seqlens, page_size,
                n_pages, PAGE=page, FMT=_perfscope_fp8kv_fmt(pool), BLOCK_P=1024,
            )
            return out
    if _perfscope_fp8kv_capturing(pool):
        return pool.to(dtype)
    out = _perfscope_fp8kv_scratch(pool, dtype)
    lens = ((seqlens.to("cpu", _perfscope_torch.long) + page_size - 1) // page_size).tolist()
    pages = [page_table[b, :n] for b, n in enumerate(lens) if n > 0]
    if not pages:
        return out
    idx = _perfscope_torch.cat(pages).to(device=pool.device, dtype=_perfscope_torch.long).clamp_(0, n_pages - 1).unique()
    src = pool.reshape(n_pages, -1)
    out.view(n_pages, -1).index_copy_(0, idx, src.index_select(0, idx).to(dtype))
    return out
# <<< perfscope fp8-kv-cast <<<
