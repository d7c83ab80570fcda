#!/usr/bin/env python3
"""PyTorch baselines for scripts/gpu-validate: a GPT-2 training step measured in PyTorch.

Self-contained (PyTorch only). The models match tests/gpu/*.tally: GPT-2 124M (d 768, 12
layers, 12 heads) and ~350M (d 1024, 24 layers, 16 heads), vocab 50257, seq 1024, tied output
head, learned positions, pre-norm blocks with erf GELU, micro-batch 16, AdamW (lr 6e-4, betas
0.9/0.95, weight decay 0.1), bf16 autocast over fp32 master weights, no checkpointing.

For each (model, mode) it measures the median step time over --steps steps after --warmup
steps, peak memory (torch.cuda.max_memory_allocated over the timed steps), tokens/s, and MFU
against the GPU's dense bf16 peak (H100/H200 SXM: 989.4 TFLOP/s). Model FLOPs per token:
6·N + 12·L·d·S (N all parameters, the tied head counted once; attention scores and values
forward and backward, not halved for the causal mask: PaLM's convention). Modes: eager, and
torch.compile (PyTorch 2).

--smoke runs a 2-layer d=64 model on the CPU in seconds (fp32 and bf16 autocast on the CPU,
PyTorch 1.13 works), so the test suite checks this script on machines without a GPU.
Results go to --json FILE (a list under "results"; one entry per model and mode, failures
included with their error) and a short summary to stdout.
"""
import argparse
import json
import math
import statistics
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {
    # name: (d, layers, heads, vocab, seq, micro_batch)
    "gpt2-124m": (768, 12, 12, 50257, 1024, 16),
    "gpt2-350m": (1024, 24, 16, 50257, 1024, 16),
    "smoke": (64, 2, 2, 256, 64, 2),
}

# Dense bf16 peak FLOP/s by GPU name fragment (no sparsity).
PEAKS = [("H200", 989.4e12), ("H100", 989.4e12), ("A100", 312e12)]


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def attention(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        hd = D // self.heads
        q, k, v = (t.view(B, S, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: flash attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.13 (smoke runs): materialised scores
            s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            mask = torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1)
            y = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, S, D))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT2(nn.Module):
    def __init__(self, d, layers, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)
        for m in self.modules():  # GPT-2's initialisation: N(0, 0.02) weights, zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, tokens):
        S = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(S, device=tokens.device))
        for b in self.h:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head
        # next-token labels, the last position ignored (as tally's next_tokens)
        labels = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -1)], dim=1)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-1)


def peak_flops(device_name, override):
    if override:
        return override * 1e12
    for frag, peak in PEAKS:
        if frag in device_name:
            return peak
    return None


def run_one(name, mode, args, device):
    d, layers, heads, vocab, seq, mb = MODELS[name]
    if args.micro_batch:
        mb = args.micro_batch
    torch.manual_seed(0)
    model = GPT2(d, layers, heads, vocab, seq).to(device)  # fp32 master weights
    n_params = sum(p.numel() for p in model.parameters())
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                fused=(device.type == "cuda"))
    except TypeError:  # PyTorch 1.13 has no fused AdamW
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    step_model = model
    compile_s = None
    if mode == "compile":
        if not hasattr(torch, "compile"):
            raise RuntimeError("torch.compile is not available in PyTorch %s" % torch.__version__)
        step_model = torch.compile(model)
    tokens = torch.randint(0, vocab, (mb, seq), device=device, generator=None)

    def step():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = step_model(tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    losses = []
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        losses.append(float(step()))
    sync()
    warm_s = time.perf_counter() - t0
    if mode == "compile":
        compile_s = warm_s  # the first steps include compilation
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        sync()
        t = time.perf_counter()
        loss = step()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
        losses.append(float(loss))
    med = statistics.median(times)
    tokens_per_step = mb * seq
    flops = 6.0 * n_params * tokens_per_step + 12.0 * layers * d * seq * tokens_per_step
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(dev_name, args.peak_tflops) if device.type == "cuda" else None
    return {
        "model": name, "mode": mode, "ok": True, "device": dev_name, "torch": torch.__version__,
        "d": d, "layers": layers, "heads": heads, "vocab": vocab, "seq": seq, "micro_batch": mb,
        "params": n_params, "warmup_steps": args.warmup, "timed_steps": args.steps,
        "step_ms_median": med, "step_ms_all": times, "warmup_s": warm_s, "compile_s": compile_s,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "tokens_per_s": tokens_per_step / (med / 1e3),
        "flops_per_step": flops, "flops_formula": "6*N*T + 12*L*d*S*T",
        "peak_flops": peak, "mfu": (flops / (med / 1e3) / peak) if peak else None,
        "loss_first": losses[0], "loss_last": losses[-1],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="repeatable; default both GPT-2 sizes")
    ap.add_argument("--mode", choices=["eager", "compile", "both"], default="both")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=0, help="override the micro-batch (default 16)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak when the GPU is not known")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--smoke", action="store_true", help="2-layer d=64 model on the CPU, eager, 2 steps")
    args = ap.parse_args()

    if args.smoke:
        models, modes, device = ["smoke"], ["eager"], torch.device("cpu")
        args.steps, args.warmup = 2, 1
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            print("gpu_torch_baseline: no CUDA device (use --smoke on a CPU)", file=sys.stderr)
            return 2
        models = args.model or ["gpt2-124m", "gpt2-350m"]
        modes = ["eager", "compile"] if args.mode == "both" else [args.mode]
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    results = []
    for name in models:
        for mode in modes:
            try:
                r = run_one(name, mode, args, device)
            except Exception as e:  # reported, never fatal: the other runs still happen
                r = {"model": name, "mode": mode, "ok": False, "error": "%s: %s" % (type(e).__name__, e),
                     "trace": traceback.format_exc(limit=3)}
            results.append(r)
            if r["ok"]:
                mfu = "%.1f%%" % (100 * r["mfu"]) if r["mfu"] else "n/a"
                peak = "%.2f GiB" % (r["peak_bytes"] / 2**30) if r["peak_bytes"] else "n/a"
                print("%-10s %-8s step %9.2f ms  %10.0f tok/s  peak %s  MFU %s  loss %.3f -> %.3f" % (
                    name, mode, r["step_ms_median"], r["tokens_per_s"], peak, mfu, r["loss_first"], r["loss_last"]))
            else:
                print("%-10s %-8s FAILED: %s" % (name, mode, r["error"]))
            sys.stdout.flush()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results}, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
