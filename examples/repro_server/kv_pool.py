"""The paged FP8 MLA KV pool, shaped like SGLang's ``MLATokenToKVPool`` (page_size 1).

One buffer per layer of ``(size + page_size, 1, kv_lora_rank + qk_rope_head_dim)`` elements
(576 = 512 latent + 64 rope for DeepSeek), stored as ``uint8`` and viewed as ``float8_e4m3fn``
by :meth:`get_key_buffer`, exactly as SGLang stores an ``fp8_e4m3`` pool. Slot 0 is the padded
slot SGLang writes dummy outputs to; the allocator hands out slots ``1..size``.
"""

from __future__ import annotations

import threading

import torch


class MLATokenToKVPool:
    def __init__(self, size: int, layer_num: int, kv_lora_rank: int, qk_rope_head_dim: int,
                 dtype: torch.dtype, device: torch.device, page_size: int = 1, fill: bool = True):
        self.size = size
        self.page_size = page_size
        self.layer_num = layer_num
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.dtype = dtype  # float8_e4m3fn
        self.store_dtype = torch.uint8 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else dtype
        self.device = device
        self.kv_buffer = [
            torch.zeros((self.size + self.page_size, 1, self.kv_cache_dim), dtype=self.store_dtype, device=device)
            for _ in range(layer_num)
        ]
        if fill:
            self._fill_like_a_busy_server()

    def _fill_like_a_busy_server(self) -> None:
        """Write plausible FP8 values everywhere, so every page is really resident (a pool of
        untouched zero pages would make the whole-pool cast look cheaper than it is)."""
        g = torch.Generator(device="cpu").manual_seed(1234)
        block = (torch.randn((4096, 1, self.kv_cache_dim), generator=g) * 0.5).to(self.dtype)
        block = block.view(self.store_dtype).to(self.device)
        rows = self.size + self.page_size
        for buf in self.kv_buffer:
            for start in range(0, rows, block.shape[0]):
                n = min(block.shape[0], rows - start)
                buf[start:start + n].copy_(block[:n])

    def bytes_per_layer(self) -> int:
        return (self.size + self.page_size) * self.kv_cache_dim * torch.empty(0, dtype=self.dtype).element_size()

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        if self.store_dtype != self.dtype:
            return self.kv_buffer[layer_id].view(self.dtype)
        return self.kv_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        if self.store_dtype != self.dtype:
            return self.kv_buffer[layer_id][..., : self.kv_lora_rank].view(self.dtype)
        return self.kv_buffer[layer_id][..., : self.kv_lora_rank]

    def set_mla_kv_buffer(self, layer, loc: torch.Tensor, cache_k_nope: torch.Tensor,
                          cache_k_rope: torch.Tensor) -> None:
        """Store the new tokens' latent (``[T, 1, 512]``) and rope key (``[T, 1, 64]``), unscaled."""
        cache_k = torch.cat([cache_k_nope, cache_k_rope], dim=-1)
        if cache_k.dtype != self.dtype:
            cache_k = cache_k.to(self.dtype)
        if self.store_dtype != self.dtype:
            cache_k = cache_k.view(self.store_dtype)
        self.kv_buffer[layer.layer_id][loc] = cache_k


class TokenToKVPoolAllocator:
    """Free-slot list over the pool (slots 1..size; 0 is the padded slot)."""

    def __init__(self, size: int):
        self.size = size
        self._free = list(range(size, 0, -1))
        self._lock = threading.Lock()

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        with self._lock:
            if n > len(self._free):
                return None
            out = [self._free.pop() for _ in range(n)]
        return out

    def free(self, slots: list[int]) -> None:
        with self._lock:
            self._free.extend(reversed(slots))
