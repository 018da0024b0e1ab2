"""Real Kineto traces of SGLang-style decode kernel mixes on one GPU (FlashInfer 0.6.18 + torch).

    FLASHINFER_CUDA_ARCH_LIST=9.0a python3 examples/kernel_mix/make_traces.py --out DIR [--deadline S]
    python3 examples/kernel_mix/make_traces.py --out DIR --device cpu   # dry run: torch fallbacks only

A small DeepSeek-like decode model (8 layers, hidden 2048, 16 MLA heads with a 512+64 latent,
SwiGLU MLP 5632, vocab 151,936, batch 8, context 2048, page size 1) whose every layer calls the
kernels SGLang on CUDA calls: FlashInfer's ``fused_add_rmsnorm`` / ``rmsnorm``,
``apply_rope_with_cos_sin_cache_inplace``, ``BatchMLAPagedAttentionWrapper`` (backend fa2),
``silu_and_mul``, torch GEMMs, then softmax and FlashInfer sampling. Written files (each trace a
gzipped chrome trace of 3 ``ProfilerStep#N`` steps, ``record_shapes`` on, ``with_stack`` off to
stay small):

- ``fi_decode_eager.json.gz``: every kernel launched from Python (``top_k_top_p_sampling_from_probs``).
- ``fi_decode_graph.json.gz``: the forward replayed from one CUDA graph (MLA plan outside it, as in
  SGLang), FlashInfer ``softmax`` + ``top_p_sampling_from_probs`` + ``top_k_sampling_from_probs``
  after the replay.
- ``sample_topp.json.gz`` / ``sample_topk.json.gz`` / ``sample_argmax.json.gz``: the same graph
  forward, then torch-native sampling: SGLang's torch top-p path (softmax over the vocabulary,
  sort, cumsum, mask, multinomial, gather), a top-k-only path (softmax, topk, multinomial, gather),
  or greedy argmax. ``timings.json`` holds their CUDA-event step medians: topp - argmax is what
  removing torch top-p sampling saves.
- ``triton_norm_rope_eager.json.gz``: the eager model with the norms and rotary done by small
  Triton kernels named as SGLang/vLLM's Triton ones (``_rms_norm_fwd_kernel``,
  ``_rotary_fwd_kernel``) in place of FlashInfer's.
- ``timings.json``: environment, which API ran (or why it fell back to torch), CUDA-event medians
  per variant (20 timed steps after warm-up), profiled step times.
- ``log.txt``.

Each variant is written as soon as it is done; ``--deadline`` (seconds) skips what would not fit.
FlashInfer JIT-compiles its modules on first use: ``--warm`` builds them in parallel child
processes first (one per module) so the compile takes the longest module's time, not the sum.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

T0 = time.monotonic()
LOG: list[str] = []
OUT = Path(".")


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)
    try:
        (OUT / "log.txt").write_text("\n".join(LOG) + "\n")
    except OSError:
        pass


# ----------------------------------------------------------------------------- model shapes
B, HID, H, CKV, KPE, INTER, VOCAB, CTX, LAYERS = 8, 2048, 16, 512, 64, 5632, 151936, 2048, 8
TOP_K, TOP_P, TEMP = 50, 0.9, 0.7


class Ops:
    """FlashInfer APIs where they run, torch otherwise; ``status`` says which and why."""

    def __init__(self, device: torch.device, use_fi: bool):
        self.device = device
        self.status: dict[str, str] = {}
        self.fi = None
        if use_fi:
            try:
                import flashinfer  # noqa: F401
                import flashinfer.activation
                import flashinfer.norm
                import flashinfer.rope
                import flashinfer.sampling
                self.fi = flashinfer
            except Exception as e:  # noqa: BLE001
                self.status["import"] = f"flashinfer import failed: {type(e).__name__}: {e}"

    # each probe runs the API once on real tensors; a failure falls back to torch for good
    def probe(self, name: str, fn) -> bool:
        if self.fi is None:
            self.status.setdefault(name, "torch (no flashinfer)")
            return False
        try:
            fn()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.status[name] = "flashinfer"
            return True
        except Exception as e:  # noqa: BLE001
            self.status[name] = f"torch fallback: {type(e).__name__}: {str(e)[:300]}"
            log(f"probe {name} failed: {traceback.format_exc()[-800:]}")
            return False


def torch_rmsnorm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def torch_rope_inplace(pos, q, k, head, cos_sin):
    for t in (q, k):
        v = t.view(t.shape[0], -1, head)
        cos, sin = cos_sin[pos].chunk(2, dim=-1)
        cos, sin = cos[:, None, :].to(t.dtype), sin[:, None, :].to(t.dtype)
        x1, x2 = v[..., : head // 2].clone(), v[..., head // 2:].clone()
        v[..., : head // 2] = x1 * cos - x2 * sin
        v[..., head // 2:] = x2 * cos + x1 * sin


class Model:
    def __init__(self, device, use_fi: bool, triton_norm: bool = False):
        self.device = device
        dt = torch.bfloat16
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape, scale=0.02):
            return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype=dt)

        self.layers = []
        for _ in range(LAYERS):
            self.layers.append(dict(
                ln1=torch.ones(HID, device=device, dtype=dt), ln2=torch.ones(HID, device=device, dtype=dt),
                kvln=torch.ones(CKV, device=device, dtype=dt),
                wq_nope=w(HID, H * CKV), wq_pe=w(HID, H * KPE), wkv=w(HID, CKV + KPE),
                wo=w(H * CKV, HID), wgu=w(HID, 2 * INTER), wd=w(INTER, HID),
            ))
        self.final_ln = torch.ones(HID, device=device, dtype=dt)
        self.lm_head = w(HID, VOCAB)
        self.embed = w(VOCAB, HID, scale=1.0)
        pool = B * (CTX + 64)
        self.ckv_cache = [w(pool, 1, CKV, scale=1.0) for _ in range(LAYERS)]
        self.kpe_cache = [w(pool, 1, KPE, scale=1.0) for _ in range(LAYERS)]
        inv = 1.0 / (10000 ** (torch.arange(0, KPE, 2, dtype=torch.float32) / KPE))
        t = torch.arange(CTX + 128, dtype=torch.float32)
        fr = torch.outer(t, inv)
        self.cos_sin = torch.cat([fr.cos(), fr.sin()], dim=-1).to(device)
        # decode batch: B requests of CTX tokens already in the pool, one new token each
        self.kv_len = torch.full((B,), CTX, dtype=torch.int32)
        self.qo_indptr = torch.arange(B + 1, dtype=torch.int32)
        self.kv_indptr = torch.arange(B + 1, dtype=torch.int32) * CTX
        self.kv_indices = torch.cat([torch.arange(i * (CTX + 64), i * (CTX + 64) + CTX, dtype=torch.int32)
                                     for i in range(B)])
        self.out_loc = torch.tensor([i * (CTX + 64) + CTX - 1 for i in range(B)], device=device)
        self.positions = torch.full((B,), CTX - 1, dtype=torch.int64, device=device)
        self.tokens = torch.randint(0, VOCAB, (B,), generator=g, device=device)
        self.sm_scale = 1.0 / ((128 + KPE) ** 0.5)
        self.ops = Ops(device, use_fi)
        self.triton_norm = triton_norm
        self.triton = None
        self.mla = None
        self._probe()

    # ------------------------------------------------------------------ probes (eager, once)
    def _probe(self):
        o, d = self.ops, self.device
        x = torch.randn(B, HID, device=d, dtype=torch.bfloat16)
        r = torch.randn(B, HID, device=d, dtype=torch.bfloat16)
        self.fi_rms = o.probe("rmsnorm", lambda: o.fi.norm.rmsnorm(x, self.final_ln))
        self.fi_addrms = o.probe("fused_add_rmsnorm", lambda: o.fi.norm.fused_add_rmsnorm(x, r, self.final_ln))
        gu = torch.randn(B, 2 * INTER, device=d, dtype=torch.bfloat16)
        self.fi_act = o.probe("silu_and_mul", lambda: o.fi.activation.silu_and_mul(gu))
        q = torch.randn(B, H * KPE, device=d, dtype=torch.bfloat16)
        k = torch.randn(B, KPE, device=d, dtype=torch.bfloat16)
        self.fi_rope = o.probe("apply_rope_with_cos_sin_cache_inplace", lambda: o.fi.rope.apply_rope_with_cos_sin_cache_inplace(
            self.positions, q, k, KPE, self.cos_sin, is_neox=False))
        p = torch.softmax(torch.randn(B, VOCAB, device=d), -1)
        self.fi_tktp = o.probe("top_k_top_p_sampling_from_probs", lambda: o.fi.sampling.top_k_top_p_sampling_from_probs(
            p, TOP_K, TOP_P, filter_apply_order="joint"))
        self.fi_tp = o.probe("top_p_sampling_from_probs", lambda: o.fi.sampling.top_p_sampling_from_probs(p, TOP_P))
        self.fi_tk = o.probe("top_k_sampling_from_probs", lambda: o.fi.sampling.top_k_sampling_from_probs(p, TOP_K))
        lg = torch.randn(B, VOCAB, device=d)
        self.fi_softmax = o.probe("sampling.softmax", lambda: o.fi.sampling.softmax(lg, TEMP))
        self.fi_mla = o.probe("BatchMLAPagedAttentionWrapper", self._make_mla)

    def _make_mla(self):
        from flashinfer.mla import BatchMLAPagedAttentionWrapper
        d = self.device
        self.ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=d)
        self.g_qo, self.g_kvp = self.qo_indptr.to(d), self.kv_indptr.to(d)
        self.g_kvi, self.g_kvl = self.kv_indices.to(d), self.kv_len.to(d)
        self.mla = BatchMLAPagedAttentionWrapper(self.ws, use_cuda_graph=True, qo_indptr=self.g_qo,
                                                 kv_indptr=self.g_kvp, kv_indices=self.g_kvi,
                                                 kv_len_arr=self.g_kvl, backend="fa2")
        self.plan()
        qn = torch.randn(B, H, CKV, device=d, dtype=torch.bfloat16)
        qp = torch.randn(B, H, KPE, device=d, dtype=torch.bfloat16)
        self.mla.run(qn, qp, self.ckv_cache[0], self.kpe_cache[0])

    def plan(self):
        if self.mla is not None:
            self.mla.plan(self.qo_indptr, self.kv_indptr, self.kv_indices, self.kv_len, H, CKV, KPE, 1, False,
                          self.sm_scale, torch.bfloat16, torch.bfloat16)

    # ------------------------------------------------------------------ building blocks
    def rmsnorm(self, x, w):
        if self.triton_norm and self.triton is not None:
            return self.triton["rms"](x, w)
        return self.ops.fi.norm.rmsnorm(x, w) if self.fi_rms else torch_rmsnorm(x, w)

    def add_rmsnorm(self, x, res, w):  # in place: res += x; x = norm(res)
        if self.triton_norm and self.triton is not None:
            res.add_(x)
            x.copy_(self.triton["rms"](res, w))
        elif self.fi_addrms:
            self.ops.fi.norm.fused_add_rmsnorm(x, res, w)
        else:
            res.add_(x)
            x.copy_(torch_rmsnorm(res, w))

    def rope(self, q, k):
        if self.triton_norm and self.triton is not None:
            self.triton["rope"](self.positions, q, KPE, self.cos_sin)
            self.triton["rope"](self.positions, k, KPE, self.cos_sin)
        elif self.fi_rope:
            self.ops.fi.rope.apply_rope_with_cos_sin_cache_inplace(self.positions, q, k, KPE, self.cos_sin,
                                                                   is_neox=False)
        else:
            torch_rope_inplace(self.positions, q, k, KPE, self.cos_sin)

    def attention(self, i, q_nope, q_pe):
        if self.fi_mla:
            return self.mla.run(q_nope, q_pe, self.ckv_cache[i], self.kpe_cache[i])
        # torch MLA over the pool rows (dry run only)
        idx = self.kv_indices.to(self.device).long()
        ckv = self.ckv_cache[i][idx, 0].view(B, CTX, CKV)
        kpe = self.kpe_cache[i][idx, 0].view(B, CTX, KPE)
        s = (torch.einsum("bhd,btd->bht", q_nope.float(), ckv.float())
             + torch.einsum("bhd,btd->bht", q_pe.float(), kpe.float())) * self.sm_scale
        return torch.einsum("bht,btd->bhd", s.softmax(-1), ckv.float()).to(q_nope.dtype)

    def silu_mul(self, gu):
        if self.fi_act:
            return self.ops.fi.activation.silu_and_mul(gu)
        a, b = gu.chunk(2, dim=-1)
        return torch.nn.functional.silu(a) * b

    def forward(self, tokens):
        """Logits (float32) of one decode step; the residual stream is bf16."""
        res = self.embed[tokens]
        h = self.rmsnorm(res, self.layers[0]["ln1"])
        for i, L in enumerate(self.layers):
            if i > 0:
                self.add_rmsnorm(h, res, L["ln1"])
            q_nope = (h @ L["wq_nope"]).view(B, H, CKV)
            q_pe = h @ L["wq_pe"]                       # [B, H*64], contiguous for the in-place rope
            kv = h @ L["wkv"]
            c = self.rmsnorm(kv[:, :CKV].contiguous(), L["kvln"])
            k_pe = kv[:, CKV:].contiguous()
            self.rope(q_pe, k_pe)
            self.ckv_cache[i][self.out_loc, 0] = c       # append the new token to the paged cache
            self.kpe_cache[i][self.out_loc, 0] = k_pe
            o = self.attention(i, q_nope, q_pe.view(B, H, KPE))
            h = o.reshape(B, H * CKV) @ L["wo"]
            self.add_rmsnorm(h, res, L["ln2"])
            h = self.silu_mul(h @ L["wgu"]) @ L["wd"]
        self.add_rmsnorm(h, res, self.final_ln)
        return (h @ self.lm_head).float()

    # ------------------------------------------------------------------ sampling paths
    def sample_fi_joint(self, logits):
        probs = torch.softmax(logits / TEMP, dim=-1)
        if self.fi_tktp:
            return self.ops.fi.sampling.top_k_top_p_sampling_from_probs(probs, TOP_K, TOP_P,
                                                                        filter_apply_order="joint")
        return sample_torch_topp(logits)

    def sample_fi_split(self, logits):
        probs = self.ops.fi.sampling.softmax(logits, TEMP) if self.fi_softmax else torch.softmax(logits / TEMP, -1)
        a = self.ops.fi.sampling.top_p_sampling_from_probs(probs, TOP_P) if self.fi_tp else None
        b = self.ops.fi.sampling.top_k_sampling_from_probs(probs, TOP_K) if self.fi_tk else None
        return a if a is not None else (b if b is not None else torch.argmax(probs, -1))


def sample_torch_topp(logits):
    """SGLang's torch-native top-p path (``top_k_top_p_min_p_sampling_from_probs_torch``, top-k off)."""
    probs = torch.softmax(logits.div_(TEMP), dim=-1)
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[(probs_sum - probs_sort) > TOP_P] = 0.0
    sampled = torch.multinomial(probs_sort, num_samples=1)
    return torch.gather(probs_idx, dim=1, index=sampled).view(-1)


def sample_torch_topk(logits):
    """Top-k-only torch sampling: softmax over the vocabulary, topk, renormalise, multinomial, gather."""
    probs = torch.softmax(logits.div_(TEMP), dim=-1)
    vals, idx = probs.topk(TOP_K, dim=-1)
    vals = vals / vals.sum(dim=-1, keepdim=True)
    sampled = torch.multinomial(vals, num_samples=1)
    return torch.gather(idx, dim=1, index=sampled).view(-1)


def sample_argmax(logits):
    return torch.argmax(logits, dim=-1)


# ---------------------------------------------------------------------------- Triton kernels
def make_triton_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _rms_norm_fwd_kernel(X, W, Y, stride, N, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(X + row * stride + cols, mask=m, other=0.0).to(tl.float32)
        var = tl.sum(x * x, axis=0) / N
        w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(var + eps) * w
        tl.store(Y + row * stride + cols, y.to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _rotary_fwd_kernel(X, POS, CS, stride, nheads, HEAD: tl.constexpr):
        row = tl.program_id(0)
        hd = tl.program_id(1)
        half = tl.arange(0, HEAD // 2)
        p = tl.load(POS + row)
        cos = tl.load(CS + p * HEAD + half)
        sin = tl.load(CS + p * HEAD + HEAD // 2 + half)
        base = X + row * stride + hd * HEAD
        x1 = tl.load(base + half).to(tl.float32)
        x2 = tl.load(base + HEAD // 2 + half).to(tl.float32)
        tl.store(base + half, (x1 * cos - x2 * sin).to(X.dtype.element_ty))
        tl.store(base + HEAD // 2 + half, (x2 * cos + x1 * sin).to(X.dtype.element_ty))

    def rms(x, w, eps=1e-6):
        y = torch.empty_like(x)
        n = x.shape[-1]
        _rms_norm_fwd_kernel[(x.shape[0],)](x, w, y, x.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
        return y

    def rope(pos, t, head, cos_sin):
        nh = t.shape[-1] // head
        _rotary_fwd_kernel[(t.shape[0], nh)](t, pos, cos_sin, t.stride(0), nh, HEAD=head)

    return {"rms": rms, "rope": rope}


# ------------------------------------------------------------------------------- harness
class Runner:
    def __init__(self, model: Model, cuda: bool):
        self.m = model
        self.cuda = cuda
        self.graph = None
        self.static_tokens = model.tokens.clone()
        self.static_logits = None

    def capture(self):
        m = self.m
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self.static_logits = m.forward(self.static_tokens)
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_logits = m.forward(self.static_tokens)
        torch.cuda.synchronize()

    def step(self, mode: str, sampler):
        """One decode step: plan (host), forward (eager or graph replay), sampling."""
        m = self.m
        m.plan()
        if mode == "graph":
            self.static_tokens.copy_(m.tokens)
            self.graph.replay()
            logits = self.static_logits.clone()
        else:
            logits = m.forward(m.tokens)
        nxt = sampler(logits)
        return nxt

    def time_steps(self, mode, sampler, n=20, warm=3):
        for _ in range(warm):
            self.step(mode, sampler)
        if not self.cuda:
            ts = []
            for _ in range(n):
                t = time.perf_counter()
                self.step(mode, sampler)
                ts.append((time.perf_counter() - t) * 1e3)
            return {"median_ms": statistics.median(ts), "ms": [round(x, 4) for x in ts], "clock": "wall"}
        torch.cuda.synchronize()
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for a, b in evs:
            a.record()
            self.step(mode, sampler)
            b.record()
        torch.cuda.synchronize()
        ts = [a.elapsed_time(b) for a, b in evs]
        return {"median_ms": round(statistics.median(ts), 4), "ms": [round(x, 4) for x in ts],
                "clock": "cuda events, one pair around each whole step (plan + forward + sampling)"}

    def time_sampler_alone(self, sampler, logits_src, n=20):
        if not self.cuda:
            return None
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        bufs = [logits_src.clone() for _ in range(n)]
        torch.cuda.synchronize()
        for (a, b), lg in zip(evs, bufs):
            a.record()
            sampler(lg)
            b.record()
        torch.cuda.synchronize()
        ts = [a.elapsed_time(b) for a, b in evs]
        return {"median_ms": round(statistics.median(ts), 4), "ms": [round(x, 4) for x in ts]}

    def profile(self, mode, sampler, path: Path, steps=3):
        from torch.profiler import ProfilerActivity, profile, schedule
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        raw = path.with_suffix("")  # .json
        with profile(activities=acts, record_shapes=True, with_stack=False,
                     schedule=schedule(wait=1, warmup=1, active=steps, repeat=1)) as prof:
            for _ in range(steps + 2):
                self.step(mode, sampler)
                prof.step()
        if self.cuda:
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as f, gzip.open(path, "wb", compresslevel=9) as g:
            shutil.copyfileobj(f, g)
        raw.unlink()
        size = path.stat().st_size
        log(f"wrote {path.name}: {size} bytes gz")
        return size


def warm_child(which: str) -> int:
    """Build one FlashInfer JIT module by calling its API once (run as a child process)."""
    d = torch.device("cuda")
    try:
        import flashinfer
        import flashinfer.activation
        import flashinfer.norm
        import flashinfer.rope
        import flashinfer.sampling
        x = torch.randn(B, HID, device=d, dtype=torch.bfloat16)
        w = torch.ones(HID, device=d, dtype=torch.bfloat16)
        if which == "norm":
            flashinfer.norm.rmsnorm(x, w)
            flashinfer.norm.fused_add_rmsnorm(x, x.clone(), w)
        elif which == "act":
            flashinfer.activation.silu_and_mul(torch.randn(B, 2 * INTER, device=d, dtype=torch.bfloat16))
        elif which == "rope":
            cs = torch.randn(CTX + 128, KPE, device=d)
            flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
                torch.zeros(B, dtype=torch.int64, device=d), torch.randn(B, H * KPE, device=d, dtype=torch.bfloat16),
                torch.randn(B, KPE, device=d, dtype=torch.bfloat16), KPE, cs, is_neox=False)
        elif which == "sampling":
            p = torch.softmax(torch.randn(B, VOCAB, device=d), -1)
            flashinfer.sampling.top_k_top_p_sampling_from_probs(p, TOP_K, TOP_P, filter_apply_order="joint")
            flashinfer.sampling.top_p_sampling_from_probs(p, TOP_P)
            flashinfer.sampling.top_k_sampling_from_probs(p, TOP_K)
            flashinfer.sampling.softmax(torch.randn(B, VOCAB, device=d), TEMP)
        elif which == "mla":
            from flashinfer.mla import BatchMLAPagedAttentionWrapper
            ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=d)
            wr = BatchMLAPagedAttentionWrapper(ws, backend="fa2")
            n = 64
            wr.plan(torch.arange(2, dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32),
                    torch.arange(n, dtype=torch.int32), torch.tensor([n], dtype=torch.int32), H, CKV, KPE, 1, False,
                    0.1, torch.bfloat16, torch.bfloat16)
            wr.run(torch.randn(1, H, CKV, device=d, dtype=torch.bfloat16),
                   torch.randn(1, H, KPE, device=d, dtype=torch.bfloat16),
                   torch.randn(n, 1, CKV, device=d, dtype=torch.bfloat16),
                   torch.randn(n, 1, KPE, device=d, dtype=torch.bfloat16))
        torch.cuda.synchronize()
        print(f"warm {which}: ok", flush=True)
        return 0
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 1


def warm_all(deadline: float) -> dict:
    procs = {}
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", "4"))
    for w in ("mla", "sampling", "norm", "act", "rope"):
        procs[w] = subprocess.Popen([sys.executable, __file__, "--warm", w], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, env=env)
    res = {}
    for w, p in procs.items():
        left = max(5.0, deadline - (time.monotonic() - T0))
        try:
            out, _ = p.communicate(timeout=left)
            res[w] = {"rc": p.returncode, "tail": out[-1500:], "done_at_s": round(time.monotonic() - T0, 1)}
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            res[w] = {"rc": "timeout", "tail": (out or "")[-1500:]}
        log(f"warm {w}: rc={res[w]['rc']} at {time.monotonic() - T0:.1f}s")
    return res


def main() -> int:
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=330.0, help="seconds; later variants are skipped")
    ap.add_argument("--warm", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--small", action="store_true", help="CPU-sized shapes for a dry run")
    a = ap.parse_args()
    if a.small:
        global VOCAB, LAYERS, CTX, INTER
        VOCAB, LAYERS, CTX, INTER = 4096, 2, 128, 1024
    if a.warm:
        return warm_child(a.warm)
    OUT = Path(a.out)
    OUT.mkdir(parents=True, exist_ok=True)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    res: dict = {"shapes": dict(batch=B, hidden=HID, heads=H, ckv=CKV, kpe=KPE, inter=INTER, vocab=VOCAB,
                                context=CTX, layers=LAYERS, top_k=TOP_K, top_p=TOP_P, temperature=TEMP,
                                page_size=1, dtype="bfloat16"),
                 "env": {"torch": torch.__version__, "python": sys.version.split()[0],
                         "FLASHINFER_CUDA_ARCH_LIST": os.environ.get("FLASHINFER_CUDA_ARCH_LIST")},
                 "variants": {}, "traces": {}}
    if cuda:
        res["env"]["gpu"] = torch.cuda.get_device_name(0)
        res["env"]["cc"] = list(torch.cuda.get_device_capability(0))
        res["env"]["cuda"] = torch.version.cuda
    use_fi = cuda and not a.no_flashinfer
    if use_fi:
        try:
            import flashinfer
            res["env"]["flashinfer"] = flashinfer.__version__
        except Exception as e:  # noqa: BLE001
            res["env"]["flashinfer"] = f"import failed: {e}"
        try:
            import triton
            res["env"]["triton"] = triton.__version__
        except Exception:  # noqa: BLE001
            pass
        res["warm"] = warm_all(deadline=min(a.deadline * 0.55, 200))

    def save():
        (OUT / "timings.json").write_text(json.dumps(res, indent=1))

    def left():
        return a.deadline - (time.monotonic() - T0)

    save()
    t = time.monotonic()
    model = Model(dev, use_fi)
    res["ops"] = model.ops.status
    log(f"model built + probed in {time.monotonic() - t:.1f}s: {json.dumps(model.ops.status)}")
    save()
    run = Runner(model, cuda)

    # 1. FlashInfer decode loop, eager
    try:
        res["variants"]["fi_eager"] = run.time_steps("eager", model.sample_fi_joint)
        res["traces"]["fi_decode_eager"] = run.profile("eager", model.sample_fi_joint, OUT / "fi_decode_eager.json.gz")
        log(f"fi eager median {res['variants']['fi_eager']['median_ms']} ms")
    except Exception:  # noqa: BLE001
        res["variants"]["fi_eager"] = {"error": traceback.format_exc()[-1500:]}
        log(res["variants"]["fi_eager"]["error"])
    save()

    # 2. the same under a CUDA graph
    graph_ok = False
    if cuda:
        try:
            run.capture()
            graph_ok = True
            res["variants"]["fi_graph"] = run.time_steps("graph", model.sample_fi_split)
            res["traces"]["fi_decode_graph"] = run.profile("graph", model.sample_fi_split, OUT / "fi_decode_graph.json.gz")
            log(f"fi graph median {res['variants']['fi_graph']['median_ms']} ms")
        except Exception:  # noqa: BLE001
            res["variants"]["fi_graph"] = {"error": traceback.format_exc()[-1500:]}
            log(res["variants"]["fi_graph"]["error"])
        save()

    # 3. torch sampling pair (+ top-k-only) on the same forward
    mode = "graph" if graph_ok else "eager"
    res["sampling_mode"] = mode
    for name, fn in (("argmax", sample_argmax), ("topp", sample_torch_topp), ("topk", sample_torch_topk)):
        if left() < 25:
            res["variants"][f"sample_{name}"] = {"skipped": "deadline"}
            continue
        try:
            v = run.time_steps(mode, fn)
            lg = run.static_logits.clone() if graph_ok else model.forward(model.tokens)
            v["sampler_alone"] = run.time_sampler_alone(fn, lg)
            res["variants"][f"sample_{name}"] = v
            res["traces"][f"sample_{name}"] = run.profile(mode, fn, OUT / f"sample_{name}.json.gz")
            log(f"sample {name} median {v['median_ms']} ms")
        except Exception:  # noqa: BLE001
            res["variants"][f"sample_{name}"] = {"error": traceback.format_exc()[-1500:]}
            log(res["variants"][f"sample_{name}"]["error"])
        save()
    try:
        va, vp, vk = (res["variants"].get(f"sample_{n}", {}).get("median_ms") for n in ("argmax", "topp", "topk"))
        if va is not None and vp is not None:
            res["torch_topp_saving_ms"] = round(vp - va, 4)
        if va is not None and vk is not None:
            res["torch_topk_saving_ms"] = round(vk - va, 4)
    except Exception:  # noqa: BLE001
        pass
    save()

    # 4. Triton norm/rotary kernels named as SGLang/vLLM's, eager
    if left() > 30 and cuda:
        try:
            tm = Model.__new__(Model)
            tm.__dict__.update(model.__dict__)
            tm.triton_norm = True
            tm.triton = make_triton_kernels()
            tm.triton["rms"](model.tokens.new_zeros(B, HID, dtype=torch.bfloat16) + 1, model.final_ln)
            tr = Runner(tm, cuda)
            res["variants"]["triton_eager"] = tr.time_steps("eager", sample_argmax)
            res["traces"]["triton_norm_rope_eager"] = tr.profile("eager", sample_argmax,
                                                                 OUT / "triton_norm_rope_eager.json.gz")
        except Exception:  # noqa: BLE001
            res["variants"]["triton_eager"] = {"error": traceback.format_exc()[-1500:]}
            log(res["variants"]["triton_eager"]["error"])
    res["total_s"] = round(time.monotonic() - T0, 1)
    save()
    log(f"done in {res['total_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
