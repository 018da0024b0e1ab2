"""Build FlashInfer's JIT modules that SGLang's FlashInfer MLA backend plans for this model (MLA
paged decode; ragged prefill with head_dim 192/128), in the background while the checkpoint is
written; FlashInfer's file lock makes the server wait for a build in progress instead of redoing it.
Same public calls as the backend, so the module names match.

    python3 warm_flashinfer.py CONFIG_JSON"""

import json
import sys
import threading
import time

import torch

c = json.load(open(sys.argv[1]))
H, R, P = c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
QK, V = c["qk_nope_head_dim"] + P, c["v_head_dim"]
bf, dev = torch.bfloat16, torch.device("cuda")
t0 = time.time()
import flashinfer  # noqa: E402


def mla():
    w = flashinfer.BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), backend="auto")
    ind = torch.arange(3, dtype=torch.int32, device=dev)
    w.plan(ind, ind * 16, torch.arange(32, dtype=torch.int32, device=dev), torch.full((2,), 16, dtype=torch.int32, device=dev),
           H, R, P, 1, False, 0.1, bf, bf)
    kv = torch.randn(32, 1, R + P, dtype=bf, device=dev)
    w.run(torch.randn(2, H, R, dtype=bf, device=dev), torch.randn(2, H, P, dtype=bf, device=dev), kv[..., :R], kv[..., R:])


def ragged():
    r = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD",
                                                       backend="auto")
    qo = torch.tensor([0, 64], dtype=torch.int32, device=dev)
    r.begin_forward(qo_indptr=qo, kv_indptr=qo, num_qo_heads=H, num_kv_heads=H, head_dim_qk=QK, head_dim_vo=V,
                    q_data_type=bf, causal=True)
    r.forward(torch.randn(64, H, QK, dtype=bf, device=dev), torch.randn(64, H, QK, dtype=bf, device=dev),
              torch.randn(64, H, V, dtype=bf, device=dev), causal=True, sm_scale=0.1, logits_soft_cap=0.0)


errs = []


def run(f):
    t = time.time()
    try:
        f()
        torch.cuda.synchronize()
        print(f"{f.__name__} built and ran in {time.time() - t:.1f}s", flush=True)
    except Exception as e:  # noqa: BLE001 - the server builds it itself then
        errs.append(f"{f.__name__}: {e!r}")
        print(errs[-1], flush=True)


# --no-ragged: the server runs with --flashinfer-mla-disable-ragged (its prefill on the paged MLA
# kernel): the ragged prefill module, the longer build, is not needed
ths = [threading.Thread(target=run, args=(f,)) for f in ((mla,) if "--no-ragged" in sys.argv else (mla, ragged))]
[t.start() for t in ths]
[t.join() for t in ths]
print(f"warm-up done in {time.time() - t0:.1f}s, errors {errs}", flush=True)
