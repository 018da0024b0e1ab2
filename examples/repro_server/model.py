"""A small MLA decoder with random weights: N layers of two BF16 projections + MLA attention.

Per layer (absorbed MLA, as DeepSeek runs decode): ``h = rmsnorm(x)``; one GEMM makes the query
(``heads x (512 latent + 64 rope)``) and the new token's KV (512 latent + 64 rope); attention reads
the paged FP8 pool; a second GEMM maps ``heads x 512`` back to the hidden size. Tokens are greedy
(or sampled with a fixed seed); no tokenizer, no real model: the point is the step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Optional

import torch

from .kv_pool import MLATokenToKVPool, TokenToKVPoolAllocator
from .mla_attention import flashinfer_mla_available


@dataclass
class ModelConfig:
    num_hidden_layers: int = 4
    hidden_size: int = 256
    num_attention_heads: int = 4
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    vocab_size: int = 1024

    @property
    def scaling(self) -> float:
        return 1.0 / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * (self.kv_lora_rank + self.qk_rope_head_dim)

    @property
    def in_proj_out(self) -> int:
        return self.q_dim + self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def o_proj_in(self) -> int:
        return self.num_attention_heads * self.kv_lora_rank

    def weight_bytes_per_layer(self, elem: int = 2) -> int:
        return (self.hidden_size * self.in_proj_out + self.o_proj_in * self.hidden_size) * elem



def config_from_args(args, presets: dict):
    """(ModelConfig, pick): the model the server's options describe, each unset option taken from the
    device's preset; ``pick(name)`` resolves the other sized options the same way. Rank 0 and the
    other TP ranks build their shards from it, so they cannot disagree."""
    preset = presets["cuda" if args.device.startswith("cuda") else "cpu"]

    def pick(name):
        v = getattr(args, name)
        return preset[name] if v is None else v

    cfg = ModelConfig(num_hidden_layers=pick("num_layers"), hidden_size=pick("hidden_size"),
                      num_attention_heads=pick("num_heads"), vocab_size=pick("vocab_size"))
    return cfg, pick

class ForwardMode(Enum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [T]
    out_cache_loc: torch.Tensor  # [T] pool rows written by this forward
    qo_indptr: torch.Tensor  # [bs+1] int32
    kv_indptr: torch.Tensor  # [bs+1] int32
    kv_indices: torch.Tensor  # [sum kv] int32: pool rows each request reads
    kv_lens: torch.Tensor  # [bs] int32
    extend_num_tokens: int = 0
    last_token_index: Optional[torch.Tensor] = None  # [bs] row of each request's last token
    kv_lens_host: Optional[list] = None  # kv_lens as Python ints (no device sync to read them)
    # (qo_indptr, kv_indptr, kv_lens) as host tensors (pinned on CUDA): the attention plan reads
    # them there, so planning needs no device sync (the overlap scheduler plans while the GPU runs)
    plan_host: Optional[tuple] = None


def host_tensor(data, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """``data`` (a list or a CPU tensor) as a CPU tensor of ``dtype``; in page-locked memory when
    ``pin``, so that a ``non_blocking`` copy to the GPU is asynchronous. The pinned block comes
    from torch's caching host allocator, which records the copy and does not hand the block out
    again before the copy has run."""
    t = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
    if t.dtype != dtype:
        t = t.to(dtype)
    return t.pin_memory() if pin else t


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: a stream-ordered copy with no host sync when ``t`` is pinned
    (torch's blocking host-to-device copy synchronises the stream; this one does not)."""
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


@dataclass
class AttnLayer:
    """What the backend reads from SGLang's RadixAttention."""

    layer_id: int
    tp_q_head_num: int
    tp_k_head_num: int
    head_dim: int  # 576
    v_head_dim: int  # 512 (the latent: absorbed MLA)
    scaling: float
    logit_cap: float = 0.0


@dataclass
class _LayerWeights:
    w_in: torch.Tensor
    w_out: torch.Tensor
    norm: torch.Tensor


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if x.is_cuda:
        # one fused kernel on the GPU (SGLang runs a fused RMSNorm too); the eager form below
        # launches ~7 small kernels per call, 120 per decode step at 60 layers
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class ModelRunner:
    def __init__(self, cfg: ModelConfig, *, max_total_tokens: int, device: str = "cpu",
                 kv_strategy: str = "source", flashinfer_backend: str = "auto", use_flashinfer: Optional[bool] = None,
                 seed: int = 0, fill_pool: bool = True):
        from .kv_variants import backend_class

        self.model_config = cfg
        self.device = torch.device(device)
        self.dtype = torch.bfloat16
        self.kv_cache_dtype = torch.float8_e4m3fn
        self.flashinfer_backend = flashinfer_backend
        self.use_flashinfer = flashinfer_mla_available(self.device) if use_flashinfer is None else use_flashinfer
        self.max_total_num_tokens = max_total_tokens
        self.token_to_kv_pool = MLATokenToKVPool(max_total_tokens, cfg.num_hidden_layers, cfg.kv_lora_rank,
                                                 cfg.qk_rope_head_dim, self.kv_cache_dtype, self.device,
                                                 fill=fill_pool)
        self.allocator = TokenToKVPoolAllocator(max_total_tokens)
        self.kv_strategy = kv_strategy
        self.attn_backend = backend_class(kv_strategy)(self)
        if self.device.type == "cuda":
            # ~15 GB of random weights at the CUDA preset: draw them on the GPU (seconds, not minutes)
            g = torch.Generator(device=self.device).manual_seed(seed)

            def rnd(*shape, fan_in):
                w = torch.randn(*shape, generator=g, device=self.device, dtype=torch.float32)
                return w.div_(math.sqrt(fan_in)).to(self.dtype)
        else:
            g = torch.Generator(device="cpu").manual_seed(seed)

            def rnd(*shape, fan_in):
                return (torch.randn(*shape, generator=g) / math.sqrt(fan_in)).to(self.dtype).to(self.device)

        H = cfg.hidden_size
        self.embed = rnd(cfg.vocab_size, H, fan_in=1)
        self.layers: list[_LayerWeights] = []
        self.attn_layers: list[AttnLayer] = []
        for i in range(cfg.num_hidden_layers):
            self.layers.append(_LayerWeights(
                w_in=rnd(H, cfg.in_proj_out, fan_in=H),
                w_out=rnd(cfg.o_proj_in, H, fan_in=cfg.o_proj_in),
                norm=torch.ones(H, dtype=self.dtype, device=self.device),
            ))
            self.attn_layers.append(AttnLayer(i, cfg.num_attention_heads, 1,
                                              cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.kv_lora_rank,
                                              cfg.scaling))
        self.final_norm = torch.ones(H, dtype=self.dtype, device=self.device)
        self.lm_head = rnd(H, cfg.vocab_size, fan_in=H)

    # ------------------------------------------------------------------------------- forward
    def attention(self, x: torch.Tensor, lw: "_LayerWeights", layer: AttnLayer, fb: ForwardBatch) -> torch.Tensor:
        """RMSNorm, GEMM 1 (query + new latent KV) and MLA attention of one layer; returns the
        attention output before the output projection."""
        cfg = self.model_config
        nh, L, R = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        qkv = _rmsnorm(x, lw.norm) @ lw.w_in  # BF16 GEMM 1
        q = qkv[:, : nh * L]
        q_rope = qkv[:, nh * L: nh * (L + R)]
        k = qkv[:, nh * (L + R): nh * (L + R) + L].unsqueeze(1)
        k_rope = qkv[:, nh * (L + R) + L:].unsqueeze(1)
        be = self.attn_backend
        if fb.forward_mode.is_decode():
            return be.forward_decode(q, k, k, layer, fb, q_rope=q_rope, k_rope=k_rope)
        return be.forward_extend(q, k, k, layer, fb, q_rope=q_rope, k_rope=k_rope)

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Run one forward; returns the logits of each request's last token ``[bs, vocab]``."""
        x = self.embed[fb.input_ids]
        for lw, layer in zip(self.layers, self.attn_layers):
            x = x + self.attention(x, lw, layer, fb) @ lw.w_out  # BF16 GEMM 2
        if fb.last_token_index is not None:
            x = x[fb.last_token_index]
        return _rmsnorm(x, self.final_norm) @ self.lm_head

    def build_batch(self, mode: ForwardMode, input_ids, slots, new_slots: list[list[int]]) -> ForwardBatch:
        """``input_ids[i]`` the tokens this forward feeds for request i, ``slots[i]`` every pool row
        request i reads (its whole context, the new tokens included), ``new_slots[i]`` those it writes.

        ``slots[i]`` may be a list of ints or a 1-D CPU tensor (cheaper: no per-token Python work).
        For a decode batch ``input_ids`` may instead be a 1-D tensor of one token per request,
        already on the device (the overlap scheduler feeds the previous step's sampled tokens
        without reading them back). On CUDA every host array goes up through pinned memory with
        asynchronous copies: building a batch never waits for the GPU."""
        dev = self.device
        pin = dev.type == "cuda"
        bs = len(slots)
        i32 = torch.int32
        kv_lens = [len(s) for s in slots]
        if isinstance(input_ids, torch.Tensor):
            if not mode.is_decode() or input_ids.dim() != 1 or input_ids.numel() != bs:
                raise ValueError("a tensor of input ids must be a decode batch's one token per request")
            q_lens = [1] * bs
            ids = input_ids if input_ids.device.type == dev.type else input_ids.to(dev, non_blocking=True)
            ids = ids.to(torch.long)  # no-op for sampled ids (int64)
        else:
            q_lens = [len(i) for i in input_ids]
            ids = to_device(host_tensor([t for i in input_ids for t in i], torch.long, pin), dev)
        qo, kvp = [0], [0]
        for a, b in zip(q_lens, kv_lens):
            qo.append(qo[-1] + a)
            kvp.append(kvp[-1] + b)
        if any(isinstance(s, torch.Tensor) for s in slots):
            flat_kv = torch.cat([torch.as_tensor(s, dtype=i32) for s in slots])
        else:
            flat_kv = [r for s in slots for r in s]
        flat_new = [r for s in new_slots for r in s]
        qo_h, kvp_h, lens_h = host_tensor(qo, i32, pin), host_tensor(kvp, i32, pin), host_tensor(kv_lens, i32, pin)
        last = None
        if not mode.is_decode():
            last = to_device(host_tensor([qo[i + 1] - 1 for i in range(bs)], torch.long, pin), dev)
        return ForwardBatch(
            forward_mode=mode, batch_size=bs,
            input_ids=ids,
            out_cache_loc=to_device(host_tensor(flat_new, torch.long, pin), dev),
            qo_indptr=to_device(qo_h, dev),
            kv_indptr=to_device(kvp_h, dev),
            kv_indices=to_device(host_tensor(flat_kv, i32, pin), dev),
            kv_lens=to_device(lens_h, dev),
            extend_num_tokens=sum(q_lens),
            last_token_index=last,
            kv_lens_host=kv_lens,
            plan_host=(qo_h, kvp_h, lens_h),
        )

    def run_batch(self, fb: ForwardBatch) -> torch.Tensor:
        self.attn_backend.init_forward_metadata(fb)
        return self.forward(fb)


class CudaGraphRunner:
    """Capture the decode forward once per batch size; replay it with fresh inputs.

    The attention plan runs outside the graph (as in SGLang): each captured size owns a wrapper
    built with fixed buffers, re-planned before every replay. The KV cast, when the source does it,
    is inside the graph and replays every step, as it does in SGLang.
    """

    def __init__(self, runner: ModelRunner, max_bs: int, max_context: int):
        self.r = runner
        self.max_bs = max_bs
        self.max_context = max_context
        self.batch_sizes = [b for b in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 256) if b <= max_bs]
        if not self.batch_sizes or self.batch_sizes[-1] != max_bs:
            self.batch_sizes.append(max_bs)
        self.graphs: dict[int, tuple] = {}
        self.replay_events: Optional[tuple] = None  # (start, end) CUDA events recorded around g.replay()
        self._qo_host: dict[int, torch.Tensor] = {}  # pinned [0, 1, .., bs] per captured size (the plan's qo_indptr)
        self._capture_all()

    def _capture_all(self) -> None:
        from .mla_attention import make_mla_wrapper

        r, dev = self.r, self.r.device
        be = r.attn_backend
        cap = self.max_bs * self.max_context
        self.ws = be.workspace_buffer
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.batch_sizes):
            qo = torch.arange(bs + 1, dtype=torch.int32, device=dev)
            kvp = torch.arange(bs + 1, dtype=torch.int32, device=dev)
            kvi = torch.zeros(cap, dtype=torch.int32, device=dev)
            kvl = torch.ones(bs, dtype=torch.int32, device=dev)
            wrapper = make_mla_wrapper(self.ws, use_flashinfer=r.use_flashinfer, backend=r.flashinfer_backend,
                                       use_cuda_graph=True, qo_indptr=qo, kv_indptr=kvp, kv_indices=kvi,
                                       kv_len_arr=kvl, max_kv_len=self.max_context)
            fb = ForwardBatch(ForwardMode.DECODE, bs, torch.zeros(bs, dtype=torch.long, device=dev),
                              torch.zeros(bs, dtype=torch.long, device=dev), qo, kvp, kvi, kvl)
            be.init_forward_metadata(fb, decode_wrapper=wrapper)
            for _ in range(2):  # warm up (JIT, allocator) outside the graph
                r.forward(fb)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = r.forward(fb)
            self.graphs[bs] = (g, fb, wrapper, out)
        torch.cuda.synchronize()

    def can_run(self, fb: ForwardBatch) -> bool:
        longest = max(fb.kv_lens_host) if fb.kv_lens_host else int(fb.kv_lens.max())
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs and longest <= self.max_context

    def replay(self, fb: ForwardBatch, ready_event=None) -> torch.Tensor:
        """Copy the batch into the captured buffers, plan, and launch the graph. Nothing here waits
        for the GPU (host arrays go up through pinned memory; the plan reads host arrays), so the
        overlap scheduler can call it while the previous step still runs. ``ready_event`` (a CUDA
        event) is recorded after the plan's copies and before the replay: once it has fired, the
        plan's page-locked staging buffers may be written by the next plan."""
        bs = next(b for b in self.batch_sizes if b >= fb.batch_size)
        g, sfb, wrapper, out = self.graphs[bs]
        n, pad = fb.batch_size, bs - fb.batch_size
        if pad:
            sfb.input_ids[n:].zero_()
            sfb.out_cache_loc[n:].zero_()  # padded requests write slot 0, the dummy slot
        sfb.input_ids[:n].copy_(fb.input_ids, non_blocking=True)
        sfb.out_cache_loc[:n].copy_(fb.out_cache_loc, non_blocking=True)
        # lengths known on the host: no small kernels to pad them, no device read-back
        lens = list(fb.kv_lens_host) if fb.kv_lens_host is not None else [int(x) for x in fb.kv_lens.tolist()]
        lens += [1] * pad
        ptr = [0]
        for x in lens:
            ptr.append(ptr[-1] + x)
        kv_lens = host_tensor(lens, torch.int32, True)
        kv_indptr = host_tensor(ptr, torch.int32, True)
        qo = self._qo_host.get(bs)
        if qo is None:
            qo = self._qo_host[bs] = host_tensor(list(range(bs + 1)), torch.int32, True)
        m = fb.kv_indices.numel()
        total = m + pad
        sfb.kv_indices[:m].copy_(fb.kv_indices, non_blocking=True)
        if pad:
            sfb.kv_indices[m:total].zero_()  # each padded request reads slot 0
        self.r.attn_backend.init_forward_metadata(
            ForwardBatch(ForwardMode.DECODE, bs, sfb.input_ids, sfb.out_cache_loc, qo, kv_indptr,
                         sfb.kv_indices[:total], kv_lens, kv_lens_host=lens, plan_host=(qo, kv_indptr, kv_lens)),
            decode_wrapper=wrapper,
        )
        self.r.attn_backend.forward_metadata.kv_indices = sfb.kv_indices  # the captured tensor
        if ready_event is not None:
            ready_event.record()
        if self.replay_events is not None:  # stepbench: GPU time of the graph alone (no plan, no input copies)
            self.replay_events[0].record()
        g.replay()
        if self.replay_events is not None:
            self.replay_events[1].record()
        return out[:n]
