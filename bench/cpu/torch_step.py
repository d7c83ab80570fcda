#!/usr/bin/python3
"""torch_step.py — PyTorch's CPU training step on bench/cpu/gpt_d256.tally's model, for
comparison with `tally run bench/cpu/gpt_d256.tally` (docs/performance.md).

The same model (GPT: vocabulary 2048, 128 positions, d = 256, 4 layers, 4 heads, LayerNorm,
causal attention through F.scaled_dot_product_attention when torch has it, GELU (erf), tied head),
the same step (batch 8 as two micro-batches of 4 sequences of 128 tokens, AdamW lr 3e-4,
weight decay 0.1), fp32, eager mode. Prints the median step time of --steps timed steps after
--warmup, with torch's thread count.
Usage: /usr/bin/python3 bench/cpu/torch_step.py [--steps 5] [--warmup 2] [--threads N]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

V, CTX, D, H, L = 2048, 128, 256, 4, 4
BATCH, MICRO, SEQ = 8, 4, 128


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, -1)
        q, k, v = (t.view(b, s, H, D // H).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) / (D // H) ** 0.5
            att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            y = att.softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, D), torch.nn.Embedding(CTX, D)
        self.h = torch.nn.ModuleList(Block() for _ in range(L))
        self.lnf = torch.nn.LayerNorm(D)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for blk in self.h:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        labels = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -1)], 1)
        return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    tokens = torch.randint(0, V, (BATCH, SEQ))
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        for m in range(BATCH // MICRO):
            loss = model(tokens[m * MICRO:(m + 1) * MICRO]) / (BATCH // MICRO)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    print("torch %s, %d threads: median step %.2f ms over %d steps" % (
        torch.__version__, torch.get_num_threads(), statistics.median(times) * 1e3, a.steps))


if __name__ == "__main__":
    main()
