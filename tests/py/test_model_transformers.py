#!/usr/bin/env python3
"""Optional cross-check of the golden fixtures against Hugging Face transformers itself (Llama,
Mistral, Qwen2; Qwen3 needs transformers >= 4.51, which needs torch 2). Skipped (exit 77) when
transformers cannot be imported. Tolerance 1e-5: transformers computes RoPE cos/sin in fp32 even
in a float64 model, which moves log-probs by ~2e-6 from the all-float64 golden reference.
Measured with transformers 4.46.3: max |d| 2.5e-6 (llama), 2.2e-6 (mistral), 1.9e-6 (qwen2)."""
import json
import os
import sys

try:
    import torch
    from transformers import AutoModelForCausalLM
except Exception as e:  # noqa: BLE001 - any import failure means: helper missing
    print("skip: transformers unavailable (%s)" % e.__class__.__name__)
    sys.exit(77)

TOL = 1e-5
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
bad = 0
for arch in ["llama", "mistral", "qwen2"]:
    d = os.path.join(root, arch)
    m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64,
                                             attn_implementation="eager").eval()
    with open(os.path.join(d, "golden.json")) as f:
        g = json.load(f)
    worst = 0.0
    for seq, lp, last in zip(g["sequences"], g["logprobs"], g["last_row"]):
        ids = torch.tensor([seq])
        with torch.no_grad():
            out = torch.log_softmax(m(ids).logits[0].double(), -1)
        nxt = out[:-1].gather(1, ids[0, 1:, None])[:, 0]
        worst = max(worst, (nxt - torch.tensor(lp, dtype=torch.float64)).abs().max().item(),
                    (out[-1] - torch.tensor(last, dtype=torch.float64)).abs().max().item())
    print("%s: transformers vs golden max|dlogp| %.3e (tolerance %.0e)" % (arch, worst, TOL))
    bad += not worst <= TOL
sys.exit(1 if bad else 0)
