"""Peak memory of log-probs + entropy + backward: chunked (`learner.chunked_logits`) against the full
[tokens, vocab] logits; prints one JSON object.

    python benchmarks/memory.py [--rows 16] [--tokens 512] [--vocab 151936] [--chunk-tokens 1024]
    python benchmarks/memory.py --child chunked --out chunked.pt    # one variant's peak alone

Model: a Llama with random weights (hidden 64, 2 layers, tied embeddings, Qwen2.5's vocabulary size
by default), fp32 on the CPU; `rows` x `tokens` random ids, every token in the loss mask. The loss is
-(mean logp + mean entropy), backpropagated to every parameter. Each variant runs in its own
process: its peak is that process's peak RSS (ru_maxrss) minus its RSS once the model and the inputs
are built. Also reports the largest absolute differences between the two variants in log-probs,
entropies and gradients (all parameters).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, LlamaConfig

from horizonrl.learner.chunked_logits import LOGIT_CHUNK_TOKENS, chunked_logp_entropy
from horizonrl.learner.scoring import sampled_positions


def full_logp_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                      temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """The computation chunking replaces: all [N, vocab] logits, log_softmax, autograd through it all."""
    log_probs = (torch.nn.functional.linear(hidden, weight, bias).float() / temperature).log_softmax(dim=-1)
    logp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
    return logp, entropy


def build(vocab: int, rows: int, tokens: int, seed: int = 0):
    """The tiny Llama (random weights) and a batch of random ids, every token sampled."""
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    input_ids = torch.randint(vocab, (rows, tokens))
    ones = torch.ones_like(input_ids)
    return model, (input_ids, ones, ones)


def logp_entropy_grads(model, batch, chunk_tokens: int | None) -> dict[str, Tensor]:
    """logp, entropy and every parameter's gradient of -(mean logp + mean entropy); chunk_tokens None:
    the full logits."""
    hidden, targets, _ = sampled_positions(model, *batch)
    weight = model.get_output_embeddings().weight
    if chunk_tokens is None:
        logp, entropy = full_logp_entropy(hidden, weight, None, targets)
    else:
        logp, entropy = chunked_logp_entropy(hidden, weight, None, targets, chunk_tokens=chunk_tokens)
    (-(logp.mean() + entropy.mean())).backward()
    out = {"logp": logp.detach(), "entropy": entropy.detach()}
    out.update({f"grad/{name}": p.grad for name, p in model.named_parameters()})
    return out


def current_rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def child(args) -> None:
    """One variant in this process: prints its peak MB above the built model and inputs, saves its outputs."""
    torch.set_num_threads(args.threads)
    model, batch = build(args.vocab, args.rows, args.tokens)
    baseline = current_rss_mb()
    outputs = logp_entropy_grads(model, batch, args.chunk_tokens if args.child == "chunked" else None)
    peak = peak_rss_mb() - baseline
    torch.save(outputs, args.out)
    print(json.dumps({"peak_mb": peak}))


def compare(rows: int, tokens: int, vocab: int, chunk_tokens: int, threads: int = 1) -> dict:
    """Both variants, each in a fresh process of this script: peaks, their ratio, largest differences."""
    sizes = ["--rows", str(rows), "--tokens", str(tokens), "--vocab", str(vocab), "--chunk-tokens", str(chunk_tokens),
             "--threads", str(threads)]
    peaks, outputs = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for variant in ("full", "chunked"):
            out = Path(folder) / f"{variant}.pt"
            result = subprocess.run([sys.executable, __file__, *sizes, "--child", variant, "--out", str(out)],
                                    capture_output=True, text=True, check=True)
            peaks[variant] = json.loads(result.stdout.splitlines()[-1])["peak_mb"]
            outputs[variant] = torch.load(out)
    full, chunked = outputs["full"], outputs["chunked"]
    diff = {key: float((full[key] - chunked[key]).abs().max()) for key in full}
    grads = [key for key in full if key.startswith("grad/")]
    return {
        "rows": rows, "tokens": tokens, "vocab": vocab, "chunk_tokens": chunk_tokens,
        "peak_mb_full_logits": round(peaks["full"], 1), "peak_mb_chunked": round(peaks["chunked"], 1),
        "chunked_over_full": round(peaks["chunked"] / peaks["full"], 4),
        "max_abs_diff_logp": diff["logp"], "max_abs_diff_entropy": diff["entropy"],
        "max_abs_diff_grad": max(diff[key] for key in grads),
        "max_abs_grad": max(float(full[key].abs().max()) for key in grads),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--chunk-tokens", type=int, default=LOGIT_CHUNK_TOKENS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=["full", "chunked"], help="run only this variant, in this process")
    parser.add_argument("--out", type=Path, help="with --child: where to save its outputs")
    args = parser.parse_args()
    if args.child:
        child(args)
    else:
        print(json.dumps(compare(args.rows, args.tokens, args.vocab, args.chunk_tokens, args.threads), indent=2))


if __name__ == "__main__":
    main()
