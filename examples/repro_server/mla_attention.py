"""MLA attention over the paged FP8 KV pool, written the way SGLang writes it.

This file mirrors ``sglang/srt/layers/attention/flashinfer_mla_backend.py`` (0.5.14 - 0.5.23):
the same class names, the same ``plan()`` call (positional, q and kv dtype both
``self.data_type``) and the same whole-pool cast in ``forward_decode`` / ``forward_extend``: the
``k_buffer = ...get_key_buffer(layer.layer_id).to(q.dtype)`` line (written out only there, so that
the fix finds exactly one anchor per path).

That line IS the bug this server reproduces: every layer of every step converts the entire FP8
pool (``max_total_num_tokens + 1`` rows x 576) to BF16, although the batch reads only the rows in
its page table. perfscope's ``fp8-kv-cast`` fix patches this file (and SGLang's) into one of:

* pages: cast only the rows the batch references (:func:`cast_kv_pages`);
* fp8:   plan with ``kv_data_type`` = the FP8 pool dtype and let the kernel read FP8
         (FlashInfer >= 0.6.14 on SM90; the torch wrapper below on CPU upcasts per referenced token).

examples/repro_server/README.md lists the exact anchor lines and their patched forms. Keep the
anchors byte-identical to SGLang's: the fix module targets both files with one pattern.

On CUDA with FlashInfer installed, the wrappers are ``flashinfer.mla.BatchMLAPagedAttentionWrapper``;
elsewhere :class:`TorchMLAPagedAttentionWrapper`, a pure-torch stand-in with the same
``plan()`` / ``run()`` contract (including FlashInfer's dtype checks and FP8 scale arguments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

# --------------------------------------------------------------------------------- wrappers


class TorchMLAPagedAttentionWrapper:
    """Pure-torch ``BatchMLAPagedAttentionWrapper`` (page_size 1): same plan/run signatures.

    ``run`` gathers only the rows in ``kv_indices`` and upcasts them to the query dtype inside the
    attention math, so handing it the FP8 pool directly (``kv_data_type`` = FP8) never touches
    unreferenced rows.
    """

    def __init__(self, float_workspace_buffer: torch.Tensor, use_cuda_graph: bool = False,
                 qo_indptr: Optional[torch.Tensor] = None, kv_indptr: Optional[torch.Tensor] = None,
                 kv_indices: Optional[torch.Tensor] = None, kv_len_arr: Optional[torch.Tensor] = None,
                 backend: str = "torch", max_kv_len: int = 0) -> None:
        self.device = float_workspace_buffer.device
        self._use_cuda_graph = use_cuda_graph
        self._max_kv_len = max_kv_len
        if use_cuda_graph:
            # fixed buffers, refilled by plan() outside the graph and read by the captured run()
            max_bs = kv_len_arr.numel()
            self._pad_idx_buf = torch.zeros((max_bs, max_kv_len), dtype=torch.long, device=self.device)
            self._pad_mask_buf = torch.zeros((max_bs, max_kv_len), dtype=torch.bool, device=self.device)
        self._kv_indices_buf: Optional[torch.Tensor] = None

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
             page_size, causal, sm_scale, q_data_type, kv_data_type, use_profiler=False) -> None:
        if page_size != 1:
            raise ValueError("TorchMLAPagedAttentionWrapper supports page_size 1 only")
        if kv_data_type not in (torch.float16, torch.bfloat16, torch.float8_e4m3fn):
            raise ValueError(f"MLA kv_data_type {kv_data_type} is not supported.")
        self._q_data_type = q_data_type
        self._kv_data_type = kv_data_type
        self._sm_scale = sm_scale
        self._causal = causal
        self._num_heads = num_heads
        self._head_dim_ckv = head_dim_ckv
        qo = [int(x) for x in qo_indptr.tolist()]
        kvp = [int(x) for x in kv_indptr.tolist()]
        self._qo_indptr_host = qo
        self._kv_indptr_host = kvp
        self._kv_indices_buf = kv_indices
        bs = len(qo) - 1
        self._decode = all(qo[i + 1] - qo[i] == 1 for i in range(bs)) and not causal
        if self._decode:
            lens = [kvp[i + 1] - kvp[i] for i in range(bs)]
            lmax = self._max_kv_len if self._use_cuda_graph else max(lens, default=0)
            if self._use_cuda_graph:
                pad_idx, pad_mask = self._pad_idx_buf[:bs], self._pad_mask_buf[:bs]
                pad_idx.zero_()
                pad_mask.zero_()
            else:
                pad_idx = torch.zeros((bs, lmax), dtype=torch.long, device=self.device)
                pad_mask = torch.zeros((bs, lmax), dtype=torch.bool, device=self.device)
            idx = kv_indices.to(device=self.device, dtype=torch.long)
            for i in range(bs):
                n = lens[i]
                pad_idx[i, :n] = idx[kvp[i]:kvp[i] + n]
                pad_mask[i, :n] = True
            self._pad_idx, self._pad_mask = pad_idx, pad_mask

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None, return_lse: bool = False,
            *, ckv_scale: Optional[float] = None, kpe_scale: Optional[float] = None, **_ignored):
        # The same contract FlashInfer 0.6.18 enforces (flashinfer/mla/_core.py run()).
        if q_nope.dtype != self._q_data_type or q_pe.dtype != self._q_data_type:
            raise ValueError(f"q dtype {q_nope.dtype} does not match plan()'s q_data_type={self._q_data_type}.")
        if ckv_cache.dtype != self._kv_data_type or kpe_cache.dtype != self._kv_data_type:
            raise ValueError(f"kv dtype {ckv_cache.dtype} does not match plan()'s kv_data_type={self._kv_data_type}.")
        kv_is_fp8 = self._kv_data_type == torch.float8_e4m3fn
        if kv_is_fp8 and (ckv_scale is None or kpe_scale is None):
            raise ValueError("ckv_scale and kpe_scale are required when kv_data_type is FP8.")
        if not kv_is_fp8 and (ckv_scale is not None or kpe_scale is not None):
            raise ValueError("ckv_scale / kpe_scale are only valid when kv_data_type is FP8.")
        ckv = ckv_cache.reshape(-1, ckv_cache.shape[-1])  # page_size 1: [rows, 512] (a view)
        kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])  # [rows, 64]
        dt = q_nope.dtype
        if out is None:
            out = torch.empty_like(q_nope)
        if self._decode:
            # gather the referenced rows, then upcast only those ("per referenced token")
            c = ckv[self._pad_idx].to(dt)  # [bs, L, 512]
            r = kpe[self._pad_idx].to(dt)  # [bs, L, 64]
            if kv_is_fp8 and ckv_scale != 1.0:
                c = c * ckv_scale
            if kv_is_fp8 and kpe_scale != 1.0:
                r = r * kpe_scale
            s = torch.einsum("bhd,bld->bhl", q_nope, c) + torch.einsum("bhd,bld->bhl", q_pe, r)
            s = s.float() * self._sm_scale
            s = s.masked_fill(~self._pad_mask[:, None, :], float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num_(0.0)
            out.copy_(torch.einsum("bhl,bld->bhd", p.to(dt), c))
            return (out, torch.logsumexp(s, dim=-1)) if return_lse else out
        # extend: per request, causal over its pages (the new tokens are the last qo_len ones)
        qo, kvp = self._qo_indptr_host, self._kv_indptr_host
        idx = self._kv_indices_buf.to(device=ckv.device, dtype=torch.long)
        for i in range(len(qo) - 1):
            qs, qe, ks, ke = qo[i], qo[i + 1], kvp[i], kvp[i + 1]
            if qe == qs:
                continue
            rows = idx[ks:ke]
            c = ckv[rows].to(dt)
            r = kpe[rows].to(dt)
            if kv_is_fp8 and ckv_scale != 1.0:
                c = c * ckv_scale
            if kv_is_fp8 and kpe_scale != 1.0:
                r = r * kpe_scale
            s = torch.einsum("thd,ld->htl", q_nope[qs:qe], c) + torch.einsum("thd,ld->htl", q_pe[qs:qe], r)
            s = s.float() * self._sm_scale
            if self._causal:
                nq, nk = qe - qs, ke - ks
                qpos = torch.arange(nk - nq, nk, device=s.device)[:, None]
                kpos = torch.arange(nk, device=s.device)[None, :]
                s = s.masked_fill((kpos > qpos)[None], float("-inf"))
            p = torch.softmax(s, dim=-1)
            out[qs:qe] = torch.einsum("htl,ld->thd", p.to(dt), c)
        return out


def flashinfer_mla_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import flashinfer.mla  # noqa: F401
    except Exception:
        return False
    return True


def make_mla_wrapper(workspace: torch.Tensor, *, use_flashinfer: bool, backend: str = "auto",
                     use_cuda_graph: bool = False, qo_indptr=None, kv_indptr=None, kv_indices=None,
                     kv_len_arr=None, max_kv_len: int = 0):
    if use_flashinfer:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        if use_cuda_graph:
            return BatchMLAPagedAttentionWrapper(workspace, use_cuda_graph=True, qo_indptr=qo_indptr,
                                                 kv_indptr=kv_indptr, kv_indices=kv_indices,
                                                 kv_len_arr=kv_len_arr, backend=backend)
        return BatchMLAPagedAttentionWrapper(workspace, backend=backend)
    return TorchMLAPagedAttentionWrapper(workspace, use_cuda_graph=use_cuda_graph, qo_indptr=qo_indptr,
                                         kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr,
                                         max_kv_len=max_kv_len)


# ------------------------------------------------------------------------- the "pages" helper

_PAGE_SCRATCH: dict = {}


def cast_kv_pages(kv_buffer: torch.Tensor, kv_indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast only the pool rows ``kv_indices`` to ``dtype``, into a reused pool-shaped buffer.

    The result has the pool's shape, so the attention plan (its ``kv_indices``) is unchanged; rows
    the batch does not reference hold stale values and are never read. One scratch buffer per
    (shape, dtype, device) is shared by all layers (they run one after another).
    """
    key = (tuple(kv_buffer.shape), dtype, kv_buffer.device)
    out = _PAGE_SCRATCH.get(key)
    if out is None:
        out = _PAGE_SCRATCH[key] = torch.zeros(kv_buffer.shape, dtype=dtype, device=kv_buffer.device)
    rows = kv_indices.to(device=kv_buffer.device, dtype=torch.long)
    out.index_copy_(0, rows, kv_buffer.index_select(0, rows).to(dtype))
    return out


# ---------------------------------------------------------------------------- the backend

KV_INDPTR_CAPACITY = 4096  # largest decode batch the backend's kv_indptr buffer holds in place


@dataclass
class DecodeMetadata:
    decode_wrapper: object
    kv_indices: Optional[torch.Tensor] = None  # pool rows this batch reads (page_size 1)


@dataclass
class PrefillMetadata:
    prefill_wrapper: object
    use_ragged: bool = False
    kv_indices: Optional[torch.Tensor] = None


class FlashInferMLAAttnBackend:
    """Decode/extend attention for the MLA layers (absorbed form: q is 512 latent + 64 rope)."""

    def __init__(self, model_runner) -> None:
        self.device = model_runner.device
        self.data_type = model_runner.dtype
        self.kv_cache_dtype = model_runner.kv_cache_dtype
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.use_flashinfer = model_runner.use_flashinfer
        self.workspace_buffer = torch.empty(
            (128 * 1024 * 1024 if self.use_flashinfer else 8,), dtype=torch.uint8, device=self.device
        )
        # As in SGLang: one kv_indptr buffer that the decode indices updater fills in place before
        # every plan(), CUDA-graph replays included, so its address never changes (a patched backend
        # may read a batch's row count from it on the GPU). Sized for any decode batch.
        self.kv_indptr = torch.zeros((KV_INDPTR_CAPACITY + 1,), dtype=torch.int32, device=self.device)
        self.decode_wrapper = make_mla_wrapper(self.workspace_buffer, use_flashinfer=self.use_flashinfer,
                                               backend=model_runner.flashinfer_backend)
        self.prefill_wrapper_paged = make_mla_wrapper(self.workspace_buffer, use_flashinfer=self.use_flashinfer,
                                                      backend=model_runner.flashinfer_backend)
        self.indices_updater_decode = FlashInferMLAIndicesUpdaterDecode(model_runner, self)
        self.indices_updater_prefill = FlashInferMLAIndicesUpdaterPrefill(model_runner, self)
        self.forward_metadata = None

    def init_forward_metadata(self, forward_batch, decode_wrapper=None) -> None:
        if forward_batch.forward_mode.is_decode():
            decode_wrapper = decode_wrapper or self.decode_wrapper
            kv_indices = self.indices_updater_decode.update(forward_batch, decode_wrapper)
            self.forward_metadata = DecodeMetadata(decode_wrapper, kv_indices)
        else:
            kv_indices = self.indices_updater_prefill.update(forward_batch, self.prefill_wrapper_paged)
            self.forward_metadata = PrefillMetadata(self.prefill_wrapper_paged, False, kv_indices)

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, forward_batch,
                       save_kv_cache: bool = True, q_rope: Optional[torch.Tensor] = None,
                       k_rope: Optional[torch.Tensor] = None):
        prefill_wrapper_paged = self.forward_metadata.prefill_wrapper

        # Save kv cache
        if save_kv_cache and k is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        if q_rope is not None:
            q = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
            q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)

        # mla paged prefill
        k_buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)
        o = q.new_empty(q.shape)
        o = prefill_wrapper_paged.run(
            q,
            q_rope,
            k_buf[:, :, : layer.v_head_dim],
            k_buf[:, :, layer.v_head_dim :],
            out=o,
        )
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, forward_batch,
                       save_kv_cache: bool = True, q_rope: Optional[torch.Tensor] = None,
                       k_rope: Optional[torch.Tensor] = None):
        decode_wrapper = self.forward_metadata.decode_wrapper

        if k is not None and save_kv_cache:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)

        # Reshape inputs
        q_nope = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)

        k_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)

        o = q_nope.new_empty(q_nope.shape)
        o = decode_wrapper.run(
            q_nope,
            q_rope,
            k_buffer[:, :, : layer.v_head_dim],
            k_buffer[:, :, layer.v_head_dim :],
            out=o,
        )
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)


class FlashInferMLAIndicesUpdaterDecode:
    def __init__(self, model_runner, attn_backend: FlashInferMLAAttnBackend):
        self.num_local_heads = model_runner.model_config.num_attention_heads
        self.kv_lora_rank = model_runner.model_config.kv_lora_rank
        self.qk_rope_head_dim = model_runner.model_config.qk_rope_head_dim
        self.scaling = model_runner.model_config.scaling
        self.data_type = model_runner.dtype
        self.attn_backend = attn_backend

    def update(self, forward_batch, wrapper) -> torch.Tensor:
        kv_indptr = forward_batch.kv_indptr
        buf = self.attn_backend.kv_indptr
        if kv_indptr.numel() <= buf.numel():
            buf[: kv_indptr.numel()].copy_(kv_indptr, non_blocking=True)  # stream-ordered, no host wait
            kv_indptr = buf[: kv_indptr.numel()]
        qo_indptr, kv_lens = forward_batch.qo_indptr, forward_batch.kv_lens
        if getattr(forward_batch, "plan_host", None) is not None:
            # the same arrays on the host: plan() reads its indptrs on the host, and a device copy
            # would make it wait for the GPU (like SGLang's fast_mla_decode_plan, which plans from
            # host arrays so the overlap scheduler never blocks on the running step)
            qo_indptr, kv_indptr, kv_lens = forward_batch.plan_host
        return self.call_begin_forward(wrapper, qo_indptr, kv_indptr,
                                       forward_batch.kv_indices, kv_lens)

    def call_begin_forward(self, wrapper, q_indptr, kv_indptr, kv_indices, kv_lens) -> torch.Tensor:
        sm_scale = self.scaling
        wrapper.plan(
            q_indptr,
            kv_indptr,
            kv_indices,
            kv_lens,
            self.num_local_heads,
            self.kv_lora_rank,
            self.qk_rope_head_dim,
            1,
            False,
            sm_scale,
            self.data_type,
            self.data_type,
        )
        return kv_indices


class FlashInferMLAIndicesUpdaterPrefill:
    def __init__(self, model_runner, attn_backend: FlashInferMLAAttnBackend):
        self.num_local_heads = model_runner.model_config.num_attention_heads
        self.kv_lora_rank = model_runner.model_config.kv_lora_rank
        self.qk_rope_head_dim = model_runner.model_config.qk_rope_head_dim
        self.scaling = model_runner.model_config.scaling
        self.data_type = model_runner.dtype
        self.q_data_type = model_runner.dtype
        self.attn_backend = attn_backend

    def update(self, forward_batch, wrapper) -> torch.Tensor:
        qo_indptr, kv_indptr, kv_lens = forward_batch.qo_indptr, forward_batch.kv_indptr, forward_batch.kv_lens
        if getattr(forward_batch, "plan_host", None) is not None:  # host arrays: no device sync in plan()
            qo_indptr, kv_indptr, kv_lens = forward_batch.plan_host
        return self.call_begin_forward(wrapper, qo_indptr, kv_indptr, forward_batch.kv_indices, kv_lens)

    def call_begin_forward(self, wrapper, qo_indptr, kv_indptr, kv_indices, kv_lens) -> torch.Tensor:
        sm_scale = self.scaling
        wrapper.plan(
            qo_indptr,
            kv_indptr,
            kv_indices,
            kv_lens,
            self.num_local_heads,
            self.kv_lora_rank,
            self.qk_rope_head_dim,
            1,
            True,
            sm_scale,
            self.q_data_type,
            self.data_type,
        )
        return kv_indices
