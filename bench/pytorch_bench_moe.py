#!/usr/bin/env python3
"""bench-moe in PyTorch eager: the comparison issue 24 asks for.

The model of configs/bench-moe.toml written the way a PyTorch user would
write it without a fused kernel library: vocab 8192, D 512, 8 layers of
RMSNorm -> attention (8 heads, RoPE, causal) -> RMSNorm -> MoE (8 experts
top-2, softmax router renormalised over the chosen two, SwiGLU experts of
hidden 1024, Switch aux loss 1e-2 and router z-loss 1e-3), untied LM head;
bf16 autocast on the CPU, fp32 master weights, AdamW. Tokens come from the
same prepared shard moetron trains on (or random ids when none is given).

Prints one JSON object: median step seconds after warm-up, tokens/s and
peak RSS. Run by bench/trainer_vs_pytorch.sh; needs python3-torch (Debian),
which that script installs, never `make test`.
"""
import argparse
import json
import math
import resource
import time

import numpy as np
import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def rope_tables(seq, head_dim, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = torch.outer(torch.arange(seq).float(), inv)
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, cos, sin):  # x: [B, H, S, hd], pairs (2i, 2i+1)
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


class Attention(torch.nn.Module):
    def __init__(self, d, heads, seq, theta):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, d, bias=False)
        self.v = torch.nn.Linear(d, d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        cos, sin = rope_tables(seq, self.hd, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        mask = torch.full((seq, seq), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        split = lambda t: t.view(b, s, self.h, self.hd).transpose(1, 2)
        q = apply_rope(split(self.q(x)), self.cos[:s], self.sin[:s])
        k = apply_rope(split(self.k(x)), self.cos[:s], self.sin[:s])
        v = split(self.v(x))
        # PyTorch 1.13 has no fused scaled_dot_product_attention.
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd) + self.mask[:s, :s]
        att = torch.softmax(att.float(), dim=-1).to(v.dtype)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        return self.o(y)


class MoE(torch.nn.Module):
    def __init__(self, d, experts, top_k, hidden, aux_coef, z_coef):
        super().__init__()
        self.e, self.k = experts, top_k
        self.aux_coef, self.z_coef = aux_coef, z_coef
        self.router = torch.nn.Linear(d, experts, bias=False)
        self.w13 = torch.nn.Parameter(torch.randn(experts, 2 * hidden, d) * 0.02)
        self.w2 = torch.nn.Parameter(torch.randn(experts, d, hidden) * 0.02)

    def forward(self, x):
        b, s, d = x.shape
        xt = x.reshape(-1, d)
        logits = self.router(xt.float()).float()
        probs = torch.softmax(logits, dim=-1)
        weight, idx = torch.topk(probs, self.k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(xt)
        for e in range(self.e):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            gate, up = F.linear(xt[tok], self.w13[e]).chunk(2, dim=-1)
            h = F.linear(F.silu(gate) * up, self.w2[e])
            out.index_add_(0, tok, (h * weight[tok, slot, None]).to(out.dtype))
        frac = F.one_hot(idx, self.e).float().sum(1).mean(0) / self.k
        aux = self.aux_coef * self.e * (frac * probs.mean(0)).sum()
        z = self.z_coef * torch.logsumexp(logits, -1).pow(2).mean()
        return out.view(b, s, d), aux + z


class Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n1, self.n2 = RMSNorm(a.d), RMSNorm(a.d)
        self.attn = Attention(a.d, a.heads, a.seq, 10000.0)
        self.moe = MoE(a.d, a.experts, a.top_k, a.expert_hidden, 1e-2, 1e-3)

    def forward(self, x):
        h = x + self.attn(self.n1(x))
        y, aux = self.moe(self.n2(h))
        return h + y, aux


class Model(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = torch.nn.Embedding(a.vocab, a.d)
        self.blocks = torch.nn.ModuleList([Block(a) for _ in range(a.layers)])
        self.norm = RMSNorm(a.d)
        self.head = torch.nn.Linear(a.d, a.vocab, bias=False)

    def forward(self, ids, targets):
        x = self.embed(ids)
        aux = 0.0
        for blk in self.blocks:
            x, a = blk(x)
            aux = aux + a
        logits = self.head(self.norm(x)).float()
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return ce, aux


def batches(a):
    """Consecutive windows of a prepared split (train.bin: little-endian
    int32 ids, data/token_dataset.h), or random ids."""
    n = a.micro_batch * (a.seq + 1)
    if a.tokens:
        data = np.fromfile(a.tokens, dtype="<i4")
        data = data[: len(data) // n * n].astype(np.int64)
        for i in range(0, len(data), n):
            w = torch.from_numpy(data[i : i + n]).view(a.micro_batch, a.seq + 1)
            yield w[:, :-1], w[:, 1:]
    gen = torch.Generator().manual_seed(1)
    while True:
        w = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=gen)
        yield w[:, :-1], w[:, 1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", default="", help="a prepared train.bin (optional)")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-hidden", type=int, default=1024)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=8)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Model(a)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    times, losses = [], []
    data = batches(a)
    for step in range(a.warmup + a.steps):
        ids, tgt = next(data)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ce, aux = model(ids, tgt)
        (ce + aux).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        losses.append(float(ce))
        if step >= a.warmup:
            times.append(dt)
    med = sorted(times)[len(times) // 2]
    tokens = a.micro_batch * a.seq
    print(json.dumps({
        "impl": "pytorch-eager",
        "torch": torch.__version__,
        "threads": a.threads,
        "steps": a.steps,
        "step_seconds_median": med,
        "step_seconds": times,
        "tokens_per_second": tokens / med,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }))


if __name__ == "__main__":
    main()
