"""`perfscope fix fp8-kv-cast --probe`: run with the server's python on the server's host.

argv[1] = strategy (native|pages), argv[2] = path of a file holding the helper snippet (or "-").
Plans and runs FlashInfer's MLA wrapper on a small paged problem twice: the reference is the
original code path (BF16 plan, whole pool converted), the candidate is the chosen strategy. Prints
one JSON line: {"ok", "max_abs_diff", "ref_max_abs", "tolerance", "reason"}.
Not run on this project's CPU-only CI machines: it needs a GPU and FlashInfer.
"""

import json
import sys

TOL = 0.1  # BF16 attention over FP8-rounded KV: a standalone harness on one H200 saw 0.047 on outputs of magnitude 3.8


def main():
    strategy = sys.argv[1]
    try:
        import torch
        import flashinfer
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "reason": f"cannot import torch/flashinfer: {e}"}
    if not torch.cuda.is_available():
        return {"ok": False, "reason": "no CUDA device visible to this python"}
    ns = {}
    if len(sys.argv) > 2 and sys.argv[2] != "-":
        # imported from its file, not exec'd from a string: Triton's @jit reads the kernels' source
        import importlib.util

        spec = importlib.util.spec_from_file_location("perfscope_fp8kv_snippet", sys.argv[2])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ns = vars(mod)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    heads, ckv, kpe, pool_rows = 16, 512, 64, 8192
    lens = [300, 1700]
    pool = (torch.randn(pool_rows, 1, ckv + kpe, device=dev) * 0.5).to(torch.float8_e4m3fn)
    perm = torch.randperm(pool_rows - 1, device=dev)[: sum(lens)] + 1
    kv_indices = perm.to(torch.int32)
    kv_indptr = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device=dev)
    qo_indptr = torch.arange(0, len(lens) + 1, dtype=torch.int32, device=dev)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    q_nope = torch.randn(len(lens), heads, ckv, device=dev, dtype=torch.bfloat16)
    q_pe = torch.randn(len(lens), heads, kpe, device=dev, dtype=torch.bfloat16)
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    scale = 1.0 / (ckv + kpe) ** 0.5

    def run(kv_dtype, kv, **kw):
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="auto")
        w.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, heads, ckv, kpe, 1, False, scale, torch.bfloat16, kv_dtype)
        return w, w.run(q_nope, q_pe, kv[:, :, :ckv], kv[:, :, ckv:], **kw)

    _, ref = run(torch.bfloat16, pool.to(torch.bfloat16))
    try:
        if strategy == "native":
            _, got = run(torch.float8_e4m3fn, pool, ckv_scale=1.0, kpe_scale=1.0)
        else:
            w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="auto")
            w.plan(
                qo_indptr,
                kv_indptr,
                kv_indices,
                kv_lens,
                heads,
                ckv,
                kpe,
                1,
                False,
                scale,
                torch.bfloat16,
                torch.bfloat16,
            )
            conv = ns["_perfscope_fp8kv_rows"](pool, torch.bfloat16, w._kv_indices_buf, kv_indptr, len(lens))
            got = w.run(q_nope, q_pe, conv[:, :, :ckv], conv[:, :, ckv:])
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "reason": f"{strategy} kernel failed: {type(e).__name__}: {e}"[:500]}
    torch.cuda.synchronize()
    diff = (ref.float() - got.float()).abs().max().item()
    ok = diff <= TOL and bool(torch.isfinite(got).all())
    return {
        "ok": ok,
        "max_abs_diff": diff,
        "ref_max_abs": ref.float().abs().max().item(),
        "tolerance": TOL,
        "device": torch.cuda.get_device_name(),
        "flashinfer": flashinfer.__version__,
        "reason": "" if ok else f"max abs diff {diff:.4g} > {TOL}",
    }


if __name__ == "__main__":
    print(json.dumps(main()))
