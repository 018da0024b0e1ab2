"""Write a random checkpoint for a DeepSeek-V2-shaped MLA config (dense layers only): every weight
matrix N(0, std) (std = the config's initializer_range, 0.02), every RMSNorm weight 1, as one
model.safetensors beside a copy of config.json. Made on the GPU machine itself: nothing is carried.

    python3 make_checkpoint.py CONFIG_JSON OUT_DIR [--seed 0]

Weights of this scale make attention matter (logits spread over several nats), unlike SGLang's
``--load-format dummy`` (every logprob ~ -ln(vocab)), so comparing per-token logprobs of two servers
checks the attention path."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def shapes(c: dict) -> dict[str, tuple[int, ...]]:
    h, v, n = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    nope, rope, vd, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    inter = c["intermediate_size"]
    if c.get("q_lora_rank"):
        raise SystemExit("q_lora_rank set: this writer makes the q_proj (no q LoRA) layout only")
    if c.get("first_k_dense_replace", 0) < c["num_hidden_layers"]:
        raise SystemExit("MoE layers in this config: this writer makes dense layers only")
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (n * (nope + rope), h),
            p + "self_attn.kv_a_proj_with_mqa.weight": (r + rope, h),
            p + "self_attn.kv_a_layernorm.weight": (r,),
            p + "self_attn.kv_b_proj.weight": (n * (nope + vd), r),
            p + "self_attn.o_proj.weight": (h, n * vd),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    t = time.time()
    c = json.loads(Path(a.config).read_text())
    std = float(c.get("initializer_range", 0.02))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    tensors = {}
    for name, shp in shapes(c).items():
        if len(shp) == 1:
            x = torch.ones(shp, dtype=torch.bfloat16)
        else:
            x = (torch.randn(shp, generator=g, device=dev, dtype=torch.float32) * std).to(torch.bfloat16).cpu()
        tensors[name] = x.contiguous()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(a.config, out / "config.json")
    n = sum(x.numel() for x in tensors.values())
    print(json.dumps({"params": n, "bytes": (out / "model.safetensors").stat().st_size, "std": std,
                      "seed": a.seed, "tensors": len(tensors), "seconds": round(time.time() - t, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
