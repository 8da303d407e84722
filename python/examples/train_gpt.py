"""A small GPT trained on the course's own text, with SDPA's attention or the course's.

    python3 python/examples/train_gpt.py --attention flashcourse --seed 0 --out runs/fc0.jsonl
    python3 python/examples/train_gpt.py --attention sdpa --seed 0 --out runs/sdpa0.jsonl
    python3 python/examples/train_gpt.py --attention flashcourse --varlen --out runs/fc_varlen.jsonl

Byte-level (256 symbols), 8 layers of width 512 and 8 heads of d = 64 (about 25 M parameters),
learned positions, pre-norm blocks, AdamW, bf16 autocast; the corpus is the repository's lessons and
sources (every .md, .cpp, .cu, .cuh, .hpp and .py under it), read as bytes, with nothing downloaded.
A fixed seed fixes the weights and every batch, so two runs of one seed differ only by their
attention.

Batches are documents: a random stretch of a random file, of a random length up to the context.
Padded (the default): each row one document, right-padded to the longest of the batch, causal
attention (a padded row's real tokens see only real tokens before them) and no loss on the padding.
--varlen: the same documents packed back to back into one row, positions restarting in each, the
attention of flash_attention_varlen() (cu_seqlens), nothing computed for padding.

Writes one JSON line per step (loss, tokens, milliseconds, tokens per second: the real tokens, padding
not counted), a first line with the run's settings and a last with the median tokens per second over
the steps after the warm-up.
"""
import argparse
import itertools
import json
import math
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SUFFIXES = (".md", ".cpp", ".cu", ".cuh", ".hpp", ".py")


def corpus(root: str) -> list:
    """The repository's text files as byte tensors, in a fixed order (the build folders left out)."""
    docs = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "build")) and d != "__pycache__")
        for name in sorted(files):
            if name.endswith(SUFFIXES):
                with open(os.path.join(folder, name), "rb") as f:
                    data = f.read()
                if len(data) > 64:
                    docs.append(torch.frombuffer(bytearray(data), dtype=torch.uint8).long())
    return docs


class Attention(torch.nn.Module):
    def __init__(self, width, heads, kind):
        super().__init__()
        self.heads, self.kind = heads, kind
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.proj = torch.nn.Linear(width, width, bias=False)

    def forward(self, x, cu_seqlens=None, max_len=0):
        *lead, n, w = x.shape
        q, k, v = self.qkv(x).view(*lead, n, 3, self.heads, w // self.heads).unbind(-3)  # each (..., N, H, d)
        if cu_seqlens is not None:  # one packed row: (total, H, d)
            from flashcourse import flash_attention_varlen
            out = flash_attention_varlen(q[0], k[0], v[0], cu_seqlens, cu_seqlens, max_len, max_len, causal=True)[None]
        elif self.kind == "flashcourse":
            from flashcourse import flash_attention
            out = flash_attention(q, k, v, causal=True, layout="bnhd")
        else:
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True).transpose(1, 2)
        return self.proj(out.reshape(*lead, n, w))


class Block(torch.nn.Module):
    def __init__(self, width, heads, kind):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attn = Attention(width, heads, kind)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x, cu_seqlens=None, max_len=0):
        x = x + self.attn(self.norm1(x), cu_seqlens, max_len)
        return x + self.mlp(self.norm2(x))


class GPT(torch.nn.Module):
    def __init__(self, layers, width, heads, context, kind):
        super().__init__()
        self.tokens = torch.nn.Embedding(256, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads, kind) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 256, bias=False)

    def forward(self, idx, pos, cu_seqlens=None, max_len=0):
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x, cu_seqlens, max_len)
        return self.head(self.norm(x))


def batch(docs, gen, rows, context, min_len):
    """`rows` documents of random lengths in [min_len, context + 1]: (inputs, targets) pairs of bytes."""
    out = []
    for _ in range(rows):
        doc = docs[int(torch.randint(len(docs), (1,), generator=gen))]
        n = int(torch.randint(min_len, context + 2, (1,), generator=gen))
        n = min(n, len(doc))
        start = int(torch.randint(len(doc) - n + 1, (1,), generator=gen))
        piece = doc[start:start + n]
        out.append((piece[:-1], piece[1:]))
    return out


def padded(pieces, device):
    """Rows right-padded to the longest; targets -1 (no loss) on the padding."""
    n = max(len(x) for x, _ in pieces)
    idx = torch.zeros(len(pieces), n, dtype=torch.long)
    tgt = torch.full((len(pieces), n), -1, dtype=torch.long)
    for r, (x, y) in enumerate(pieces):
        idx[r, :len(x)], tgt[r, :len(y)] = x, y
    pos = torch.arange(n).expand(len(pieces), n)
    return idx.to(device), pos.to(device), tgt.to(device), None, 0


def packed(pieces, device):
    """One row of the documents back to back, positions restarting in each, cu_seqlens between them."""
    lens = [len(x) for x, _ in pieces]
    idx = torch.cat([x for x, _ in pieces])[None]
    tgt = torch.cat([y for _, y in pieces])[None]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
    return idx.to(device), pos.to(device), tgt.to(device), cu, max(lens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attention", choices=("sdpa", "flashcourse"), default="flashcourse")
    ap.add_argument("--varlen", action="store_true", help="pack the documents (cu_seqlens) instead of padding them")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rows", type=int, default=32, help="documents per batch")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--min-len", type=int, default=32, help="shortest document, in bytes")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the speed's median")
    ap.add_argument("--out", required=True, help="the JSON-lines record to write")
    a = ap.parse_args()
    if a.varlen and a.attention != "flashcourse":
        ap.error("--varlen runs flash_attention_varlen(): give --attention flashcourse (SDPA has no packed form)")
    if not torch.cuda.is_available():
        ap.error("a CUDA GPU is needed")
    device = "cuda"
    docs = corpus(REPO)
    torch.manual_seed(a.seed)
    model = GPT(a.layers, a.width, a.heads, a.context + 1, a.attention).to(device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps)))
    gen = torch.Generator().manual_seed(a.seed)  # the batches: the same for every attention at one seed
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    speeds = []
    with open(a.out, "w") as f:
        f.write(json.dumps({"kind": "settings", **vars(a), "parameters": params, "documents": len(docs),
                            "corpus_bytes": sum(len(d) for d in docs), "gpu": torch.cuda.get_device_name(),
                            "torch": torch.__version__, "python": platform.python_version(),
                            "date": time.strftime("%Y-%m-%d", time.gmtime())}) + "\n")
        for step in range(a.steps):
            pieces = batch(docs, gen, a.rows, a.context, a.min_len)
            idx, pos, tgt, cu, max_len = (packed if a.varlen else padded)(pieces, device)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(idx, pos, cu, max_len)
            loss = F.cross_entropy(logits.float().view(-1, 256), tgt.view(-1), ignore_index=-1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            tokens = int((tgt >= 0).sum())
            if step >= a.warmup:
                speeds.append(tokens / ms * 1e3)
            f.write(json.dumps({"kind": "step", "step": step, "loss": loss.item(), "tokens": tokens,
                                "padded_tokens": int(tgt.numel()), "ms": ms, "tokens_per_s": tokens / ms * 1e3}) + "\n")
        f.write(json.dumps({"kind": "summary", "tokens_per_s_median": statistics.median(speeds) if speeds else None,
                            "steps_timed": len(speeds), "final_loss": loss.item()}) + "\n")
    print(f"{a.attention}{' varlen' if a.varlen else ''} seed {a.seed}: {params / 1e6:.1f} M parameters, final loss "
          f"{loss.item():.3f}, {statistics.median(speeds) if speeds else 0:.0f} tokens/s -> {a.out}")


if __name__ == "__main__":
    main()
