"""The GPU peers' transformers loading (grpo_bench.py, hf_diff_bench.py): the dtype names tidal's
flags use, and from_pretrained across transformers 4.x (torch_dtype) and 5 (dtype), with the
rehearsal's fallback to eager attention where an old torch lacks SDPA (on a CPU only)."""
import torch
from transformers import AutoModelForCausalLM

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def load(path, dtype, attn, dev="cuda"):
    kw = {"attn_implementation": attn}
    try:
        try:
            return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
        except TypeError:   # transformers 4.x spells it torch_dtype
            return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, **kw)
    except ImportError as e:   # SDPA on a torch before 2.1.1: only a CPU rehearsal may fall back
        if dev.startswith("cuda") or attn == "eager":
            raise
        print(f"note: attention {attn} unavailable ({e}); eager instead (a rehearsal's figures)", flush=True)
        return load(path, dtype, "eager", dev)
