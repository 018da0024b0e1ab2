"""The three KV strategies as fixed code, for ``--kv-strategy pool|pages|fp8`` benchmarking.

The server's default (``--kv-strategy source``) runs :mod:`mla_attention` as its source reads now,
which is what perfscope's fix patches and what ``perfscope demo`` measures before and after. The
classes here do not change when that file is patched: they exist so that the three strategies can
be compared side by side (``python -m examples.repro_server.stepbench``). Never patch this file.

Each variant overrides only the lines the fix changes; the rest is inherited.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional


from . import mla_attention as M

STRATEGIES = ("pool", "pages", "fp8")


class PoolBackend(M.FlashInferMLAAttnBackend):
    """The bug: the whole FP8 pool cast to BF16 per layer (SGLang 0.4.6.post5 - 0.5.23)."""

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None):
        decode_wrapper = self.forward_metadata.decode_wrapper
        if k is not None and save_kv_cache:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        q_nope = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
        k_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)
        o = q_nope.new_empty(q_nope.shape)
        o = decode_wrapper.run(q_nope, q_rope, k_buffer[:, :, : layer.v_head_dim],
                               k_buffer[:, :, layer.v_head_dim :], out=o)
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None):
        prefill_wrapper_paged = self.forward_metadata.prefill_wrapper
        if save_kv_cache and k is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        q = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
        k_buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)
        o = q.new_empty(q.shape)
        o = prefill_wrapper_paged.run(q, q_rope, k_buf[:, :, : layer.v_head_dim],
                                      k_buf[:, :, layer.v_head_dim :], out=o)
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)


class PagesBackend(PoolBackend):
    """Cast only the rows the batch references (the portable fix: any GPU, any FlashInfer)."""

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None):
        decode_wrapper = self.forward_metadata.decode_wrapper
        if k is not None and save_kv_cache:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        q_nope = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
        k_buffer = M.cast_kv_pages(self.token_to_kv_pool.get_key_buffer(layer.layer_id), self.forward_metadata.kv_indices, q.dtype)
        o = q_nope.new_empty(q_nope.shape)
        o = decode_wrapper.run(q_nope, q_rope, k_buffer[:, :, : layer.v_head_dim],
                               k_buffer[:, :, layer.v_head_dim :], out=o)
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None):
        prefill_wrapper_paged = self.forward_metadata.prefill_wrapper
        if save_kv_cache and k is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        q = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
        k_buf = M.cast_kv_pages(self.token_to_kv_pool.get_key_buffer(layer.layer_id), self.forward_metadata.kv_indices, q.dtype)
        o = q.new_empty(q.shape)
        o = prefill_wrapper_paged.run(q, q_rope, k_buf[:, :, : layer.v_head_dim],
                                      k_buf[:, :, layer.v_head_dim :], out=o)
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)


class _Fp8DecodeUpdater(M.FlashInferMLAIndicesUpdaterDecode):
    def call_begin_forward(self, wrapper, q_indptr, kv_indptr, kv_indices, kv_lens):
        wrapper.plan(q_indptr, kv_indptr, kv_indices, kv_lens, self.num_local_heads, self.kv_lora_rank,
                     self.qk_rope_head_dim, 1, False, self.scaling, self.data_type,
                     self.attn_backend.kv_cache_dtype)
        return kv_indices


class _Fp8PrefillUpdater(M.FlashInferMLAIndicesUpdaterPrefill):
    def call_begin_forward(self, wrapper, qo_indptr, kv_indptr, kv_indices, kv_lens):
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, self.num_local_heads, self.kv_lora_rank,
                     self.qk_rope_head_dim, 1, True, self.scaling, self.data_type,
                     self.attn_backend.kv_cache_dtype)
        return kv_indices


class Fp8Backend(PoolBackend):
    """Read FP8 directly: plan(kv_data_type=fp8), no cast; scales 1.0 (SGLang's pool is unscaled)."""

    def __init__(self, model_runner) -> None:
        super().__init__(model_runner)
        self.indices_updater_decode = _Fp8DecodeUpdater(model_runner, self)
        self.indices_updater_prefill = _Fp8PrefillUpdater(model_runner, self)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None):
        decode_wrapper = self.forward_metadata.decode_wrapper
        if k is not None and save_kv_cache:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        q_nope = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
        k_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        o = q_nope.new_empty(q_nope.shape)
        o = decode_wrapper.run(q_nope, q_rope, k_buffer[:, :, : layer.v_head_dim],
                               k_buffer[:, :, layer.v_head_dim :], out=o, ckv_scale=1.0, kpe_scale=1.0)
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None):
        prefill_wrapper_paged = self.forward_metadata.prefill_wrapper
        if save_kv_cache and k is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        q = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
        k_buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        o = q.new_empty(q.shape)
        o = prefill_wrapper_paged.run(q, q_rope, k_buf[:, :, : layer.v_head_dim],
                                      k_buf[:, :, layer.v_head_dim :], out=o, ckv_scale=1.0, kpe_scale=1.0)
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)


def backend_class(strategy: str):
    """``source`` -> mla_attention as it reads now (patched or not); else a fixed variant."""
    if strategy == "source":
        return M.FlashInferMLAAttnBackend
    return {"pool": PoolBackend, "pages": PagesBackend, "fp8": Fp8Backend}[strategy]


ANCHOR = "self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)"
_BACKEND_MARK = "# ---------------------------------------------------------------------------- the backend"


def strategy_of_source(path: Optional[Path] = None) -> str:
    """What mla_attention.py does now, read from its backend code (for /server_info and the demo):
    ``pool`` while the whole-pool cast is there, ``pages`` / ``fp8`` once patched, else ``unknown``."""
    text = Path(path or M.__file__).read_text(encoding="utf-8")
    m = re.search(r"^# perfscope fp8-kv-cast strategy: (\w+)$", text, re.M)
    if m and "# >>> perfscope fp8-kv-cast >>>" in text:  # patched by `perfscope fix fp8-kv-cast --apply`
        return {"native": "fp8", "pages": "pages"}.get(m.group(1), m.group(1))
    code = text.split(_BACKEND_MARK, 1)[-1]
    if ANCHOR in code:
        return "pool"
    if "cast_kv_pages(" in code:
        return "pages"
    if "kpe_scale=1.0" in code:
        return "fp8"
    return "unknown"
