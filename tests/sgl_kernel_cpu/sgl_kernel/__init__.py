"""The project's pure-torch stand-in for SGLang's kernel package on CPU (test use only).

What it replaces: the Python package ``sgl_kernel`` that SGLang ships as ``sglang-kernel`` on PyPI.
Every published build of it (0.4.10, the one SGLang 0.5.23 pins, included) is CUDA-only: there is no
CPU wheel and no sdist, so it cannot be installed on the CI machines, which have no GPU.

Why it is needed: with ``SGLANG_USE_CPU_ENGINE=1 --device cpu`` SGLang 0.5.23 imports exactly two
CPU ops from ``sgl_kernel`` on every run:

* ``assign_req_to_token_pool_cpu`` (``sglang/srt/mem_cache/allocation.py``): writes each request's
  newly allocated KV-cache slots into its row of the request-to-token table.
* ``copy_all_layer_kv_cache_cpu`` (``sglang/kernels/ops/kvcache/cache_move.py``): copies KV-cache
  rows from one slot to another in every layer's buffer, given the buffers' data pointers.

Both are implemented here in plain torch with the semantics of SGLang's Triton versions of the same
ops in those files. The eight speculative-decoding names SGLang imports on CPU are defined too but
raise, because only speculative decoding calls them and the tests do not use it.

What it deliberately leaves out: ``convert_weight_packed`` and every other op registered under
``torch.ops.sgl_kernel``. SGLang's ``cpu_has_amx_support()`` is true only when
``torch.ops.sgl_kernel.convert_weight_packed`` exists, so without it every layer (linear, attention
with ``--attention-backend torch_native``, norms, rotary, sampling) runs SGLang's own torch code.
Everything else in the tests' server (HTTP server, tokenizer manager, scheduler, radix cache, model,
attention, profiler) is unmodified SGLang 0.5.23 from its PyPI wheel.
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+perfscope-cpu-stand-in"


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """For request i: ``req_to_token[req_pool_indices[i], start[i]:end[i]]`` = the next
    ``end[i] - start[i]`` entries of ``out_cache_loc`` (requests' slots lie back to back)."""
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    out = 0
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[out:out + n].to(req_to_token.dtype)
        out += n


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor,
                                tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
    """For every buffer b (its first byte at ``data_ptrs[b]``, ``strides[b]`` bytes a slot):
    slot ``tgt_loc[j]`` = slot ``src_loc[j]``, all sources read before any target is written."""
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    rows = int(max(int(tgt.max()), int(src.max()))) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * int(stride))).from_address(int(ptr))
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, int(stride))
        buf[tgt] = buf[src].clone()


def _speculative_only(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: speculative decoding is not implemented in perfscope's CPU stand-in "
            "for sgl_kernel (tests/sgl_kernel_cpu)")
    op.__name__ = name
    return op


for _name in ("rotate_input_ids_cpu", "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu",
              "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
              "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu",
              "tree_speculative_sampling_target_only"):
    globals()[_name] = _speculative_only(_name)
del _name
