#!/usr/bin/python3
"""torch_reference.py — PyTorch's answers for the runtime's kernels (run by ctest, step-torch-reference).

For each kernel family, torch computes outputs and gradients (torch.nn.functional and torch.optim,
fp32 on the CPU) on fixed inputs; the script writes inputs and expected results into OUT_DIR as raw
little-endian binaries (NAME.bin) listed in OUT_DIR/index.txt, one line per tensor:
    NAME DTYPE NDIM DIM0 DIM1 ...          (DTYPE: f32 or i32)
The Catch2 cases tagged [torch] (step_torch.cpp) run our kernels on the same inputs and compare.
Without torch (import fails) it writes OUT_DIR/SKIPPED with the reason, prints it, and exits 0.
Usage: /usr/bin/python3 torch_reference.py OUT_DIR
"""
import os
import sys


def main():
    if len(sys.argv) != 2:
        print("usage: torch_reference.py OUT_DIR", file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        os.remove(os.path.join(out, name))
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # any import failure means: no PyTorch here
        reason = "PyTorch is not importable by /usr/bin/python3 (%s: %s)" % (type(e).__name__, e)
        with open(os.path.join(out, "SKIPPED"), "w") as f:
            f.write(reason + "\n")
        print("SKIPPED: " + reason)
        return 0

    torch.manual_seed(20261130)
    torch.set_num_threads(1)
    index = []

    def put(name, t):
        t = t.detach().contiguous()
        if t.dtype in (torch.int32, torch.int64):
            data = t.to(torch.int32).numpy().tobytes()  # numpy is little-endian on x86/arm
            dtype = "i32"
        else:
            data = t.to(torch.float32).numpy().tobytes()
            dtype = "f32"
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
        index.append("%s %s %d %s" % (name, dtype, t.dim(), " ".join(str(d) for d in t.shape)))

    def leaf(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(*shape) * (hi - lo) + lo).requires_grad_(True)

    def grads(y, dy, *xs):
        return torch.autograd.grad(y, xs, dy)

    # ---- unary ops ------------------------------------------------------------------------------
    x = leaf(64, lo=-4, hi=4)
    dy = torch.rand(64) * 2 - 1
    put("unary.x", x)
    put("unary.dy", dy)
    unary = {
        "gelu": lambda v: F.gelu(v),
        "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
        "silu": F.silu,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "relu": F.relu,
        "exp": torch.exp,
        "neg": torch.neg,
    }
    for name, f in unary.items():
        y = f(x)
        put("unary.%s.y" % name, y)
        put("unary.%s.dx" % name, grads(y, dy, x)[0])

    # ---- softmax --------------------------------------------------------------------------------
    x = leaf(5, 13, lo=-5, hi=5)
    dy = torch.rand(5, 13) - 0.5
    y = F.softmax(x, dim=-1)
    put("softmax.x", x); put("softmax.dy", dy); put("softmax.y", y)
    put("softmax.dx", grads(y, dy, x)[0])

    # ---- layer norm and RMS norm ------------------------------------------------------------------
    x = leaf(6, 32, lo=-3, hi=3)
    w = leaf(32, lo=0.5, hi=1.5)
    b = leaf(32)
    dy = torch.rand(6, 32) - 0.5
    y = F.layer_norm(x, (32,), w, b, eps=1e-5)
    dx, dw, db = grads(y, dy, x, w, b)
    for k, v in dict(x=x, w=w, b=b, dy=dy, y=y, dx=dx, dw=dw, db=db).items():
        put("layer_norm." + k, v)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    dx, dw = grads(y, dy, x, w)
    for k, v in dict(x=x, w=w, dy=dy, y=y, dx=dx, dw=dw).items():
        put("rms_norm." + k, v)

    # ---- cross-entropy (ignore_index = -1) ---------------------------------------------------------
    logits = leaf(7, 11, lo=-4, hi=4)
    labels = torch.tensor([3, -1, 10, 0, 5, -1, 7], dtype=torch.int64)
    loss = F.cross_entropy(logits, labels, ignore_index=-1)
    put("cross_entropy.logits", logits)
    put("cross_entropy.labels", labels)
    put("cross_entropy.loss", loss.reshape(1))
    put("cross_entropy.dlogits", torch.autograd.grad(loss, logits)[0])

    # ---- embedding --------------------------------------------------------------------------------
    w = leaf(9, 5)
    ids = torch.tensor([[1, 8, 1], [0, 1, 4]], dtype=torch.int64)
    y = F.embedding(ids, w)
    dy = torch.rand(2, 3, 5) - 0.5
    put("embedding.w", w); put("embedding.ids", ids); put("embedding.dy", dy); put("embedding.y", y)
    put("embedding.dw", grads(y, dy, w)[0])

    # ---- rotary embedding (rotate-half, as Hugging Face Llama) -------------------------------------
    B, S, H, hd, theta = 2, 5, 3, 8, 10000.0
    x = leaf(B, S, H * hd)
    pos = torch.tensor([0, 3, 7, 100, 2047], dtype=torch.int64)
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.outer(pos.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    xv = x.view(B, S, H, hd)
    rot = torch.cat((-xv[..., hd // 2:], xv[..., : hd // 2]), dim=-1)
    y = (xv * cos + rot * sin).reshape(B, S, H * hd)
    dy = torch.rand(B, S, H * hd) - 0.5
    put("rope.x", x); put("rope.positions", pos); put("rope.dy", dy); put("rope.y", y)
    put("rope.dx", grads(y, dy, x)[0])

    # ---- attention: explicit, grouped-query; causal (S = Skv) and not (S != Skv); value heads of hv
    # dims, not hd (DeepSeek's MLA: q/k heads of qk_nope + qk_rope, value heads of v_head_dim) -------
    def attention(q, k, v, B, S, Skv, H, Hkv, hd, causal, hv):
        qh = q.view(B, S, H, hd).transpose(1, 2)                     # [B, H, S, hd]
        kh = k.view(B, Skv, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        vh = v.view(B, Skv, Hkv, hv).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        s = qh @ kh.transpose(-1, -2) / hd ** 0.5
        if causal:
            i = torch.arange(S)[:, None]
            j = torch.arange(Skv)[None, :]
            s = s.masked_fill(j > i + (Skv - S), float("-inf"))
        p = F.softmax(s, dim=-1)
        lse = torch.logsumexp(s, dim=-1)                              # [B, H, S]
        return (p @ vh).transpose(1, 2).reshape(B, S, H * hv), lse

    for tag, (B, S, Skv, H, Hkv, hd, causal, hv) in {
        "causal_gqa": (2, 6, 6, 4, 2, 8, True, 8),
        "cross": (1, 3, 7, 2, 1, 4, False, 4),
        "mla_values": (2, 70, 70, 3, 3, 12, True, 8),   # q/k heads 12, value heads 8; > 64 rows: two blocks
    }.items():
        q, k, v = leaf(B, S, H * hd), leaf(B, Skv, Hkv * hd), leaf(B, Skv, Hkv * hv)
        o, lse = attention(q, k, v, B, S, Skv, H, Hkv, hd, causal, hv)
        dO = torch.rand(B, S, H * hv) - 0.5
        dq, dk, dv = grads(o, dO, q, k, v)
        pre = "attention.%s." % tag
        put(pre + "dims", torch.tensor([B, S, Skv, H, Hkv, hd, int(causal), hv], dtype=torch.int32))
        for kname, t in dict(q=q, k=k, v=v, o=o, lse=lse, dO=dO, dq=dq, dk=dk, dv=dv).items():
            put(pre + kname, t)

    # ---- matmul (batched, B broadcast) --------------------------------------------------------------
    A = torch.rand(3, 4, 5) - 0.5
    Bm = torch.rand(5, 6) - 0.5
    put("matmul.A", A); put("matmul.B", Bm); put("matmul.C", A @ Bm)

    # ---- optimizers: three steps from the same start and gradients ---------------------------------
    n = 10
    p0 = torch.rand(n) * 2 - 1
    gs = [torch.rand(n) * 2 - 1 for _ in range(3)]
    put("optim.p0", p0)
    for t, g in enumerate(gs):
        put("optim.g%d" % (t + 1), g)
    configs = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
        "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05, weight_decay=0.01),
        "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, weight_decay=0.01),
        "rmsprop_momentum": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.9, weight_decay=0.01),
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    }
    for name, make in configs.items():
        p = torch.nn.Parameter(p0.clone())
        opt = make([p])
        for t, g in enumerate(gs):
            p.grad = g.clone()
            opt.step()
            put("optim.%s.p%d" % (name, t + 1), p)

    # ---- 16-bit rounding: torch's float -> bf16 / fp16 bits ---------------------------------------
    base = torch.randn(4096) * torch.pow(10.0, torch.randint(-9, 6, (4096,)).float())
    bits = base.view(torch.int32)
    # Exact ties for bf16 (low 16 bits 0x8000) and fp16 (low 13 bits 0x1000), both parities.
    ties_bf16 = (bits[:512] & ~0xFFFF) | 0x8000
    ties_f16 = (bits[512:1024] & ~0x1FFF) | 0x1000
    special = torch.tensor([0.0, -0.0, 1e-8, -1e-8, 5.96e-8, 2.98e-8, 6.1e-5, 65504.0, 65519.0, 65520.0,
                            1e6, 3.4e38, float("inf"), float("-inf")])
    xs = torch.cat([base, ties_bf16.view(torch.float32), ties_f16.view(torch.float32), special])
    put("round.x", xs)
    put("round.bf16", xs.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF)
    put("round.f16", xs.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF)

    with open(os.path.join(out, "index.txt"), "w") as f:
        f.write("\n".join(index) + "\n")
    print("wrote %d tensors to %s (torch %s)" % (len(index), out, torch.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
