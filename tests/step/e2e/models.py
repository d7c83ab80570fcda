"""models.py — the end-to-end check models in PyTorch, the same functions as the .tally files.

mlp.tally, gpt.tally (plans gpt and gpt_unfused: materialised attention, the same function),
llama.tally and gemma.tally (plans gemma and gemma_unfused: sliding window, soft-capping,
gelu_tanh, a final LayerNorm without weight or bias) (this folder) written again with torch.nn.functional, with
tally's semantics (docs/runtime.md, codegen/runtime/API.md): parameters are named by their tally
path with `[i]` written `.i`; Linear.weight is [in, out] and Linear's bias is `.b`; gelu is the
erf form; layer_norm has eps 1e-5 inside the root; RMSNorm y = x·w/√(mean(x²) + 1e-6); attention
scales by 1/√head_dim, heads are contiguous chunks of the last dimension, query head h reads kv
head h // (H/Hkv), causal (a sliding window of w keys: key j seen by query i iff
i − w < j ≤ i, as transformers' sliding_window_overlay; a soft cap c makes the scaled scores
c·tanh(s/c) before the mask, as Gemma 2); gelu_tanh is F.gelu(approximate='tanh'); rope is Hugging Face Llama's rotate-half with θ = 10000 per head;
cross entropy is the mean over positions with a label, the last position of each sequence has
none (next_tokens).

Each model is a ModelSpec: its parameters (name, shape, kind), its inputs, how to draw a batch,
and loss(params, batch) on torch tensors of any float dtype (the checks use float64).
The plan's settings (batch, micro_batch, AdamW's hyper-parameters) are read from the .tally file
(read_plan), so the two cannot drift apart.
"""
import math
import os
import re

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


class ModelSpec:
    """One check model: a .tally file and plan, and the same model as torch code."""

    def __init__(self, key, plan, params, inputs, loss, vocab=None, seq=None, stem=None):
        self.key = key                    # mlp, gpt, gpt_unfused, llama
        self.file = os.path.join(HERE, (stem or key) + ".tally")
        self.plan = plan                  # the train plan's name in that file
        self.params = params              # [(name, shape, kind)], kind: matrix|embedding|bias|norm
        self.inputs = inputs              # [(name, "F32"|"I32", per-row shape)]
        self.loss = loss                  # loss(P: name -> tensor, batch: name -> tensor) -> scalar
        self.vocab = vocab                # V for token models (the ln V check), else None
        self.seq = seq

    def draw_batch(self, rng, rows):
        """Random inputs for `rows` rows: tokens uniform in [0, V), floats standard normal."""
        out = {}
        for name, dtype, shape in self.inputs:
            if dtype == "I32":
                out[name] = rng.integers(0, self.vocab, size=(rows,) + shape).astype(np.int32)
            else:
                out[name] = rng.standard_normal((rows,) + shape).astype(np.float32)
        return out

    def check_init(self, rng):
        """Weights for the gradient check: large enough that every op is far from trivial.

        Matrices normal(0, 1/√in), embeddings normal(0, 0.2), norm weights 1 + normal(0, 0.1),
        biases normal(0, 0.1); float32 values (the torch side widens them to float64)."""
        out = {}
        for name, shape, kind in self.params:
            if kind == "matrix":
                v = rng.standard_normal(shape) / math.sqrt(shape[0])
            elif kind == "embedding":
                v = rng.standard_normal(shape) * 0.2
            elif kind == "norm":
                v = 1.0 + rng.standard_normal(shape) * 0.1
            else:
                v = rng.standard_normal(shape) * 0.1
            out[name] = v.astype(np.float32)
        return out

    def default_init(self, gen):
        """The default initialisation the issue names: normal(0, 0.02) for matrices and
        embeddings, norm weights 1, biases 0 (used by the self-test's stand-in for tally)."""
        out = {}
        for name, shape, kind in self.params:
            if kind in ("matrix", "embedding"):
                out[name] = torch.randn(shape, generator=gen, dtype=torch.float32) * 0.02
            elif kind == "norm":
                out[name] = torch.ones(shape, dtype=torch.float32)
            else:
                out[name] = torch.zeros(shape, dtype=torch.float32)
        return {k: v.numpy() for k, v in out.items()}


# ---- the plan's settings, from the .tally file ------------------------------------------------

def _number(text, key):
    m = re.search(r"\b%s\s*=\s*([0-9.eE+-]+)" % key, text)
    if not m:
        raise ValueError("no '%s = NUMBER' in %r" % (key, text))
    return float(m.group(1))


def read_plan(spec):
    """The train plan's batch, micro_batch, seq and AdamW(lr, betas, eps, weight_decay) as written
    in spec.file (the plan block named spec.plan). Raises ValueError when one is missing."""
    with open(spec.file) as f:
        text = f.read()
    m = re.search(r"^train\s+%s\s*\{(.*?)^\}" % re.escape(spec.plan), text, re.S | re.M)
    if not m:
        raise ValueError("%s: no 'train %s { ... }'" % (spec.file, spec.plan))
    body = m.group(1)
    opt = re.search(r"optimizer\s*=\s*AdamW\((.*)\)", body)
    if not opt:
        raise ValueError("%s: plan %s does not use AdamW(...)" % (spec.file, spec.plan))
    args = opt.group(1)
    betas = re.search(r"betas\s*=\s*\(\s*([0-9.eE+-]+)\s*,\s*([0-9.eE+-]+)\s*\)", args)
    if not betas:
        raise ValueError("%s: AdamW without betas = (b1, b2)" % spec.file)
    batch = int(_number(body, "batch"))
    micro = int(_number(body, "micro_batch")) if re.search(r"\bmicro_batch\b", body) else batch
    return {
        "batch": batch,
        "micro_batch": micro,
        "lr": _number(args, "lr"),
        "betas": (float(betas.group(1)), float(betas.group(2))),
        "eps": _number(args, "eps"),
        "weight_decay": _number(args, "weight_decay"),
    }


# ---- shared pieces ------------------------------------------------------------------------------

def linear(P, prefix, x, bias=True):
    y = x @ P[prefix + ".weight"]
    return y + P[prefix + ".b"] if bias else y


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, heads, theta=10000.0):
    """Rotate-half rope (HF Llama) on x [B, S, heads·hd], positions 0..S-1."""
    B, S, D = x.shape
    hd = D // heads
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq[None, :]   # [S, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)                  # [S, hd]
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    xh = x.view(B, S, heads, hd)
    x1, x2 = xh[..., : hd // 2], xh[..., hd // 2:]
    rot = torch.cat([-x2, x1], -1)
    return (xh * cos[None, :, None, :] + rot * sin[None, :, None, :]).reshape(B, S, D)


def attention(q, k, v, heads, kv_heads, causal, window=0, softcap=0.0):
    """softmax(q·kᵀ/√hd)·v per head; query head h reads kv head h // (heads/kv_heads). softcap > 0:
    the scaled scores become softcap·tanh(s / softcap) first; window > 0: an explicit band mask,
    query i (position i + Skv − S) sees keys i − window < j ≤ i."""
    B, S, D = q.shape
    hd = D // heads
    Skv = k.shape[1]
    qh = q.view(B, S, heads, hd).transpose(1, 2)
    kh = k.view(B, Skv, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
    vh = v.view(B, Skv, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(hd)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        mask = torch.ones(S, Skv, dtype=torch.bool).tril(Skv - S)
        if window:
            i = torch.arange(S)[:, None] + (Skv - S)
            j = torch.arange(Skv)[None, :]
            mask = mask & (j > i - window)
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, -1) @ vh
    return o.transpose(1, 2).reshape(B, S, D)


def next_token_loss(logits, tokens):
    """Cross entropy of position i against token i+1, the last position not counted."""
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1).long())


# ---- the three models ---------------------------------------------------------------------------

def _mlp():
    D, H, K = 16, 64, 8
    params = [("fc1.weight", (D, H), "matrix"), ("fc1.b", (H,), "bias"),
              ("fc2.weight", (H, K), "matrix"), ("fc2.b", (K,), "bias")]

    def loss(P, batch):
        err = linear(P, "fc2", F.gelu(linear(P, "fc1", batch["x"]))) - batch["y"]
        return (err * err).mean()

    return ModelSpec("mlp", "mlp", params, [("x", "F32", (D,)), ("y", "F32", (K,))], loss)


def _gpt(key="gpt"):
    """gpt.tally's plan `key`: gpt (fused attention) or gpt_unfused (materialised): one function."""
    V, ctx, d, H, L = 100, 16, 64, 4, 2
    params = [("wte.weight", (V, d), "embedding"), ("wpe.weight", (ctx, d), "embedding")]
    for i in range(L):
        p = "h.%d." % i
        params += [(p + "ln1.weight", (d,), "norm"), (p + "ln1.b", (d,), "bias"),
                   (p + "attn.qkv.weight", (d, 3 * d), "matrix"),
                   (p + "attn.qkv.b", (3 * d,), "bias"),
                   (p + "attn.proj.weight", (d, d), "matrix"), (p + "attn.proj.b", (d,), "bias"),
                   (p + "ln2.weight", (d,), "norm"), (p + "ln2.b", (d,), "bias"),
                   (p + "mlp.fc.weight", (d, 4 * d), "matrix"), (p + "mlp.fc.b", (4 * d,), "bias"),
                   (p + "mlp.proj.weight", (4 * d, d), "matrix"), (p + "mlp.proj.b", (d,), "bias")]
    params += [("lnf.weight", (d,), "norm"), ("lnf.b", (d,), "bias")]

    def loss(P, batch):
        tokens = batch["tokens"].long()
        S = tokens.shape[1]
        x = P["wte.weight"][tokens] + P["wpe.weight"][torch.arange(S)]
        for i in range(L):
            p = "h.%d." % i
            h = F.layer_norm(x, (d,), P[p + "ln1.weight"], P[p + "ln1.b"], 1e-5)
            q, k, v = linear(P, p + "attn.qkv", h).split(d, -1)
            x = x + linear(P, p + "attn.proj", attention(q, k, v, H, H, True))
            h = F.layer_norm(x, (d,), P[p + "ln2.weight"], P[p + "ln2.b"], 1e-5)
            x = x + linear(P, p + "mlp.proj", F.gelu(linear(P, p + "mlp.fc", h)))
        x = F.layer_norm(x, (d,), P["lnf.weight"], P["lnf.b"], 1e-5)
        return next_token_loss(x @ P["wte.weight"].t(), tokens)

    return ModelSpec(key, key, params, [("tokens", "I32", (ctx,))], loss, vocab=V, seq=ctx,
                     stem="gpt")


def _llama():
    V, S, d, H, Hkv, hidden = 128, 16, 64, 4, 2, 160
    dkv = d // H * Hkv
    b = "layer."
    params = [("embed.weight", (V, d), "embedding"),
              (b + "attn_norm.weight", (d,), "norm"),
              (b + "attn.q.weight", (d, d), "matrix"), (b + "attn.k.weight", (d, dkv), "matrix"),
              (b + "attn.v.weight", (d, dkv), "matrix"), (b + "attn.o.weight", (d, d), "matrix"),
              (b + "mlp_norm.weight", (d,), "norm"),
              (b + "mlp.gate.weight", (d, hidden), "matrix"),
              (b + "mlp.up.weight", (d, hidden), "matrix"),
              (b + "mlp.down.weight", (hidden, d), "matrix"),
              ("norm.weight", (d,), "norm"), ("head.weight", (d, V), "matrix")]

    def loss(P, batch):
        tokens = batch["tokens"].long()
        x = P["embed.weight"][tokens]
        h = rms_norm(x, P[b + "attn_norm.weight"])
        q = rope(linear(P, b + "attn.q", h, False), H)
        k = rope(linear(P, b + "attn.k", h, False), Hkv)
        v = linear(P, b + "attn.v", h, False)
        x = x + linear(P, b + "attn.o", attention(q, k, v, H, Hkv, True), False)
        h = rms_norm(x, P[b + "mlp_norm.weight"])
        m = F.silu(linear(P, b + "mlp.gate", h, False)) * linear(P, b + "mlp.up", h, False)
        x = x + linear(P, b + "mlp.down", m, False)
        return next_token_loss(linear(P, "head", rms_norm(x, P["norm.weight"]), False), tokens)

    return ModelSpec("llama", "llama", params, [("tokens", "I32", (S,))], loss, vocab=V, seq=S)


def _gemma(key="gemma"):
    """gemma.tally's plan `key`: gemma (fused) or gemma_unfused (materialised): one function."""
    V, d, H, Hkv, hidden, window, cap, final_cap = 128, 64, 4, 2, 128, 5, 2.0, 3.0
    S = 16
    dkv = d // H * Hkv
    params = [("embed.weight", (V, d), "embedding")]
    for blk in ("local.", "full."):
        params += [(blk + "attn_norm.weight", (d,), "norm"),
                   (blk + "attn.q.weight", (d, d), "matrix"),
                   (blk + "attn.k.weight", (d, dkv), "matrix"),
                   (blk + "attn.v.weight", (d, dkv), "matrix"),
                   (blk + "attn.o.weight", (d, d), "matrix"),
                   (blk + "mlp_norm.weight", (d,), "norm"),
                   (blk + "mlp.gate.weight", (d, hidden), "matrix"),
                   (blk + "mlp.up.weight", (d, hidden), "matrix"),
                   (blk + "mlp.down.weight", (hidden, d), "matrix")]
    # The final norm has no parameter: LayerNorm(d, affine = false), F.layer_norm without weight.

    def block(P, b, x, w):
        h = rms_norm(x, P[b + "attn_norm.weight"])
        q, k = linear(P, b + "attn.q", h, False), linear(P, b + "attn.k", h, False)
        v = linear(P, b + "attn.v", h, False)
        x = x + linear(P, b + "attn.o", attention(q, k, v, H, Hkv, True, w, cap), False)
        h = rms_norm(x, P[b + "mlp_norm.weight"])
        g = F.gelu(linear(P, b + "mlp.gate", h, False), approximate="tanh")
        return x + linear(P, b + "mlp.down", g * linear(P, b + "mlp.up", h, False), False)

    def loss(P, batch):
        tokens = batch["tokens"].long()
        x = block(P, "full.", block(P, "local.", P["embed.weight"][tokens], window), 0)
        logits = F.layer_norm(x, (d,), None, None, 1e-5) @ P["embed.weight"].t()
        return next_token_loss(final_cap * torch.tanh(logits / final_cap), tokens)

    return ModelSpec(key, key, params, [("tokens", "I32", (S,))], loss, vocab=V, seq=S,
                     stem="gemma")


MODELS = [_mlp(), _gpt(), _llama(), _gpt("gpt_unfused"), _gemma(), _gemma("gemma_unfused")]
BY_KEY = {m.key: m for m in MODELS}


# ---- one optimizer step in torch ----------------------------------------------------------------

def step_loss_and_grads(spec, plan, weights, batch, dtype=torch.float64):
    """The loss of one optimizer step (the mean over its micro-batches of each micro-batch's mean
    loss) and every parameter's gradient of it, computed in `dtype`. weights and batch are numpy
    arrays; batch holds exactly plan['batch'] rows."""
    P = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in weights.items()}
    rows, micro = plan["batch"], plan["micro_batch"]
    losses = []
    for start in range(0, rows, micro):
        mb = {}
        for k, v in batch.items():
            t = torch.from_numpy(np.ascontiguousarray(v[start:start + micro]))
            mb[k] = t if t.dtype == torch.int32 else t.to(dtype)
        losses.append(spec.loss(P, mb))
    total = torch.stack(losses).mean()
    total.backward()
    return total.item(), {k: p.grad.detach() for k, p in P.items()}, P


def adamw_after(plan, weights, grads, dtype=torch.float64, steps=1):
    """Weights after `steps` torch.optim.AdamW steps with the plan's hyper-parameters, the same
    gradient each step (grads: name -> tensor or array)."""
    P = {k: torch.tensor(v, dtype=dtype) for k, v in weights.items()}
    opt = torch.optim.AdamW(list(P.values()), lr=plan["lr"], betas=plan["betas"], eps=plan["eps"],
                            weight_decay=plan["weight_decay"])
    for _ in range(steps):
        for k, p in P.items():
            p.grad = torch.as_tensor(grads[k]).to(dtype).clone()
        opt.step()
    return {k: p.detach() for k, p in P.items()}


def train(spec, plan, weights, data, steps, dtype=torch.float64, on_first_grads=None):
    """`steps` AdamW steps in `dtype`, step k on rows k·batch .. (k+1)·batch−1 of data; returns
    (losses, final weights as numpy). on_first_grads(grads) is called after the first step's
    backward, before its update."""
    P = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in weights.items()}
    opt = torch.optim.AdamW(list(P.values()), lr=plan["lr"], betas=plan["betas"], eps=plan["eps"],
                            weight_decay=plan["weight_decay"])
    rows, micro = plan["batch"], plan["micro_batch"]
    losses = []
    for step in range(steps):
        opt.zero_grad()
        parts = []
        for start in range(step * rows, (step + 1) * rows, micro):
            mb = {}
            for k, v in data.items():
                t = torch.from_numpy(np.ascontiguousarray(v[start:start + micro]))
                mb[k] = t if t.dtype == torch.int32 else t.to(dtype)
            parts.append(spec.loss(P, mb))
        total = torch.stack(parts).mean()
        total.backward()
        losses.append(total.item())
        if step == 0 and on_first_grads is not None:
            on_first_grads({k: p.grad.detach().clone() for k, p in P.items()})
        opt.step()
    return losses, {k: p.detach().numpy().copy() for k, p in P.items()}
