#!/usr/bin/env python3
"""One call of PyTorch SDPA, forward and backward (or, with --forward-only, the forward alone), on
one backend: for Nsight Compute to profile SDPA's own kernels beside the course's
(python3 bench/session.py run ncuflash09 ncucudnn11).

The shape follows the course's grid: B * N = --tokens, H * d = --width, layout (B, H, N, d), inputs
drawn from a normal distribution. Nothing is timed or checked here: ncu replays the kernel it
profiles, and sdpa_compare.py is what compares times.
"""
import argparse


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["flash", "cudnn", "efficient"], default="flash")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--seq", type=int, default=4096, help="N (queries and keys)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16384, help="B * N")
    parser.add_argument("--width", type=int, default=2048, help="H * d")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--forward-only", action="store_true", help="no backward pass (and no gradients kept)")
    args = parser.parse_args()
    if args.tokens % args.seq or args.width % args.head_dim:
        parser.error(f"--seq {args.seq} must divide --tokens {args.tokens}, --head-dim {args.head_dim} --width {args.width}")

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from sdpa_compare import sdpa_backends  # the same names as every comparison of the course

    backend = sdpa_backends()[args.backend]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    shape = (args.tokens // args.seq, args.width // args.head_dim, args.seq, args.head_dim)
    torch.manual_seed(0)
    grad = not args.forward_only
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=grad) for _ in range(3))
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        if grad:
            o.backward(torch.randn_like(o))
    torch.cuda.synchronize()
    print(f"sdpa {args.backend} {args.dtype} B H N d = {shape}, causal {args.causal}: "
          f"{'forward and backward' if grad else 'forward'} ran")


if __name__ == "__main__":
    main()
