"""Dump a TRL GRPOTrainer run's rollouts in the layout `tidal-diff --prompts FILE` replays
(datasets/README.md, "rollouts/": trl.jsonl). Copy this file next to your training script:

    from trl import GRPOTrainer
    from trl_dump import DumpingGRPOTrainer          # instead of GRPOTrainer
    trainer = DumpingGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(
        ..., use_vllm=True, vllm_importance_sampling_correction=True),   # keeps vLLM's log-probs
        dump_dir="rollouts", dump_every=50)         # every 50th generation batch
    trainer.train()

then, on the same checkpoint (the one that generated step K's rollouts):

    tidal-diff --model CHECKPOINT --prompts rollouts/rollouts-step000050-rank0.jsonl \
               --recipe-a bf16-train -o step50.h5 && tidal-report step50.h5

`/tokens/logp_b` is then vLLM's log-prob of each sampled token, `/tokens/logp_trainer` your
trainer's (old_per_token_logps), `/tokens/logp_a` tidal's training path: engine vs trainer is the
mismatch your run really had. The rows are GRPOTrainer._generate_and_score_completions' output as
it holds it (prompt_ids/prompt_mask left-padded, completion_ids/completion_mask right-padded), one
JSON object per completion; TRL computes old_per_token_logps only when it needs them (more than
one optimisation step per generation, or the importance-sampling correction on), and
sampling_per_token_logps only with vLLM and vllm_importance_sampling_correction. Files are written
by each process for its own rows (rank in the name), through a temporary name renamed when
complete.

dump_trl_batch() is the part without TRL: it takes that dict (tensors or lists) and writes the
rows; tests/py/test_trl_dump.py checks it end to end against tidal-diff.
"""
import json
import os

KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sampling_per_token_logps",
        "old_per_token_logps", "advantages")


def _rows(x):
    """A tensor / array / list as a Python list of rows (floats kept as float32 values)."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu() if x.is_floating_point() else x.detach().cpu()
    return x.tolist() if hasattr(x, "tolist") else list(x)


def dump_trl_batch(batch, path, prompts=None):
    """Writes one JSON line per completion of a GRPOTrainer batch dict to path. Returns the rows."""
    if "sampling_per_token_logps" not in batch or batch["sampling_per_token_logps"] is None:
        raise ValueError("the batch has no sampling_per_token_logps (vLLM's log-probs): generate with use_vllm=True "
                         "and vllm_importance_sampling_correction=True, or tidal has no engine side to compare")
    cols = {k: _rows(batch[k]) for k in KEYS if k in batch and batch[k] is not None}
    n = len(cols["completion_ids"])
    for k, v in cols.items():
        if k != "advantages" and len(v) != n:
            raise ValueError(f"{k} has {len(v)} rows, completion_ids {n}")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for i in range(n):
            row = {"prompt": prompts[i] if prompts else "(text)"}
            for k, v in cols.items():
                row[k] = v[i]
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
    return n


try:  # the trainer subclass, where TRL is installed
    from trl import GRPOTrainer

    class DumpingGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that writes every dump_every-th generation batch with dump_trl_batch."""

        def __init__(self, *args, dump_dir="rollouts", dump_every=1, **kwargs):
            super().__init__(*args, **kwargs)
            self.dump_dir, self.dump_every, self._dump_calls = dump_dir, dump_every, 0

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if self._dump_calls % self.dump_every == 0:
                os.makedirs(self.dump_dir, exist_ok=True)
                name = f"rollouts-step{self.state.global_step:06d}-rank{self.accelerator.process_index}.jsonl"
                dump_trl_batch(out, os.path.join(self.dump_dir, name))
            self._dump_calls += 1
            return out
except ImportError:
    pass
