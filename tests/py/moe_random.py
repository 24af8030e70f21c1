"""A tiny random mixture of experts made by transformers itself (tests/py/test_grad_moe.py,
test_lora_moe.py): norms near 1, routers N(0, 0.5^2) so that routing is far from uniform, every
other weight N(0, 0.1^2); saved with save_pretrained (the hub's per-expert layout)."""
import os

import torch


def make(d, cls, cfg, seed):
    """writes the model into directory d and returns d"""
    torch.manual_seed(seed)
    m = cls(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif n.endswith("gate.weight") and "experts" not in n and "shared" not in n:
                p.copy_(0.5 * torch.randn_like(p))   # routers: routing far from uniform
            else:
                p.copy_(0.1 * torch.randn_like(p))
    m.save_pretrained(d, safe_serialization=True)
    return os.path.abspath(d)
