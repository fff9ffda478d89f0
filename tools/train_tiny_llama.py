"""Train a small, randomly initialised Llama for a few steps with each attention backend; print speed and memory.

    python tools/train_tiny_llama.py                                   # every backend that runs here
    python tools/train_tiny_llama.py --device cuda --steps 20 --backends sdpa,fa_ladder_triton,fa_ladder_cuda
    python tools/train_tiny_llama.py --device cpu --steps 3 --backends sdpa,fa_ladder_torch,fa_ladder_triton

The model is a transformers ``LlamaForCausalLM`` built from a config (grouped-query attention, causal; nothing
is downloaded). Every backend starts from the same weights and sees the same batches: sequences that count up
by a random step modulo the vocabulary, which a model can learn, so the loss falls within a few steps and the
loss columns of the backends should agree to a few digits.

Backends: ``sdpa`` and ``eager`` (transformers' own), and the project's ``fa_ladder_torch`` (split PyTorch
loop), ``fa_ladder_triton`` (on a CPU through Triton's interpreter: slow, keep the sizes tiny) and
``fa_ladder_cuda`` (CUDA GPU only), registered by ``flash_attention_py.hf_attention``.

Printed per backend: the loss of the first and the last step, tokens per second over the steps after the first
(the first compiles kernels), and the peak memory of one training step: ``torch.cuda.max_memory_allocated`` on a
GPU; on a CPU the growth of the process's peak resident set during the step (benchmarks/measure.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ALL_BACKENDS = ("sdpa", "eager", "fa_ladder_torch", "fa_ladder_triton", "fa_ladder_cuda")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when a GPU is visible)")
    p.add_argument("--backends", default=None,
                   help=f"comma-separated, from {', '.join(ALL_BACKENDS)} (default: those that run on the device)")
    p.add_argument("--steps", type=int, default=None, help="training steps per backend (default: 3 CPU, 20 GPU)")
    p.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (default: float32 CPU, bfloat16 GPU)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=None, help="query heads")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads (divides --heads)")
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0, help="the weights and batches (the same for every backend)")
    return p.parse_args(argv)


# sizes: (batch, seq, layers, heads, kv_heads, head_dim)
CPU_SIZES = (2, 64, 2, 4, 2, 16)
GPU_SIZES = (8, 1024, 4, 16, 4, 64)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        sys.exit(f"train_tiny_llama: --device must be cpu or cuda, got {device!r}")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("train_tiny_llama: --device cuda, but torch.cuda.is_available() is False")
    import transformers

    from benchmarks.measure import peak_memory
    from flash_attention_py.hf_attention import register_hf_backends
    from flash_attention_cuda.capabilities import cuda_unavailable_reason
    from flash_attention_py.registry import get_backend

    register_hf_backends()
    sizes = dict(zip(("batch_size", "seq_len", "layers", "heads", "kv_heads", "head_dim"),
                     CPU_SIZES if device == "cpu" else GPU_SIZES))
    for key in sizes:
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    steps = args.steps or (3 if device == "cpu" else 20)
    dtype_name = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    dtype = getattr(torch, dtype_name)

    def why_not(name):
        if name == "fa_ladder_triton":
            return get_backend("triton").unavailable_reason(device)
        if name == "fa_ladder_cuda":
            return "CUDA GPU only" if device == "cpu" else cuda_unavailable_reason()
        return None

    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        bad = [b for b in backends if b not in ALL_BACKENDS]
        if bad:
            sys.exit(f"train_tiny_llama: unknown backend(s) {', '.join(bad)}; "
                     f"expected some of {', '.join(ALL_BACKENDS)}")
    else:
        backends = [b for b in ALL_BACKENDS if why_not(b) is None and not (device == "cpu" and b == "eager")]

    hidden = sizes["heads"] * sizes["head_dim"]
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=sizes["layers"], num_attention_heads=sizes["heads"], num_key_value_heads=sizes["kv_heads"],
        head_dim=sizes["head_dim"], max_position_embeddings=max(2048, sizes["seq_len"]), attention_dropout=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    B, N = sizes["batch_size"], sizes["seq_len"]

    def batch():
        start = torch.randint(0, cfg.vocab_size, (B, 1), generator=gen)
        step = torch.randint(1, 8, (B, 1), generator=gen)
        return ((start + step * torch.arange(N)) % cfg.vocab_size).to(device)

    batches = [batch() for _ in range(steps + 1)]  # +1: the step whose memory is measured
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}), {dtype_name}, "
          f"batch {B} x {N} tokens, {sizes['layers']} layers, {sizes['heads']} query heads / {sizes['kv_heads']} "
          f"K/V heads of dim {sizes['head_dim']}, {steps} steps, transformers {transformers.__version__}, "
          f"torch {torch.__version__}")
    print(f"{'backend':<18} {'loss first':>10} {'loss last':>10} {'tokens/s':>12} {'peak memory':>12}  memory method")
    for name in backends:
        reason = why_not(name)
        if reason:
            print(f"{name:<18} skipped: {reason}")
            continue
        torch.manual_seed(args.seed)
        model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype)
        model.set_attn_implementation(name)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

        def train_step(ids):
            opt.zero_grad(set_to_none=True)
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            return loss.detach()

        losses, t0 = [], None
        for i, ids in enumerate(batches[:steps]):
            if i == 1:  # the first step compiles kernels: time the rest
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            losses.append(float(train_step(ids)))
        if device == "cuda":
            torch.cuda.synchronize()
        timed = steps - 1
        tok_s = timed * B * N / (time.perf_counter() - t0) if timed > 0 else float("nan")
        peak, _, method = peak_memory(lambda: train_step(batches[-1]), device=device, array="torch")
        print(f"{name:<18} {losses[0]:>10.4f} {losses[-1]:>10.4f} {tok_s:>12,.0f} {peak / 2**20:>9.1f} MiB  {method}")
        del model, opt


if __name__ == "__main__":
    main()
