"""Throughput and model-FLOPs utilisation (MFU) of a training run: the FLOPs a model needs per
token (PaLM's count, term by term), the GPUs' peaks, and the tokens/s + MFU window of the log.

MFU = FLOPs the model needs for the tokens trained / elapsed seconds / (peak FLOP/s x GPUs). Causal
attention counts the full T x T scores (PaLM's convention), so MFU compares with published figures.
Also CPU threads that do not thrash (`cpu_threads`) and `check_auto_device`.
"""
import contextlib
import os
import time

import torch

from cli import ConfigError


def flop_terms(cfg, seq_len: int, head_fraction: float = 1.0) -> dict:
    """Training FLOPs per token, term by term (PaLM, Chowdhery et al. 2022, appendix B): a weight
    matrix of m x n costs 2mn FLOPs per token forward and twice that backward, so 6mn in all; the
    attention scores and their weighted sum cost 2 x 2 x T x head_dim per head and layer forward,
    12 T x head_dim x heads x layers in all. Embedding lookups and norms are not counted.
    `head_fraction`: share of tokens whose vocabulary logits are computed (MLM: only the masked ones)."""
    d, L, hd, V = cfg.d_model, cfg.n_layers, cfg.head_dim, cfg.vocab_size
    e = cfg.embed_dim or d
    experts_per_token = cfg.expert_top_k if cfg.n_experts else 1
    return {
        "qkv_projection": 6 * L * d * (cfg.n_heads + 2 * cfg.n_kv_heads) * hd,
        "attention_output": 6 * L * cfg.n_heads * hd * d,
        "attention_scores": 12 * L * cfg.n_heads * hd * seq_len,
        "mlp": 6 * L * d * cfg.d_ff * (3 if cfg.glu else 2) * experts_per_token,
        "router": 6 * L * d * cfg.n_experts,
        "embedding_projection": 6 * e * d if e != d else 0,         # ALBERT's e -> d
        "head_transform": 6 * d * e * head_fraction if cfg.head_transform else 0,
        "vocabulary_projection": 6 * e * V * head_fraction,
    }


def flops_per_token(cfg, seq_len: int, head_fraction: float = 1.0) -> float:
    """Training FLOPs per token (forward + backward), the sum of flop_terms."""
    return sum(flop_terms(cfg, seq_len, head_fraction).values())


# Dense bf16 tensor-core peaks (no 2:4 sparsity), FLOP/s per GPU, matched against
# torch.cuda.get_device_name in this order: the more specific names first.
PEAK_FLOPS = (
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H200 NVL", 835e12),  # lower clocks / power than SXM
    ("GH200", 989e12), ("H200", 989e12), ("H100", 989e12),                # SXM (H100 "80GB HBM3")
    ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12), ("A10", 125e12),
)


def peak_flops(device):
    """Dense bf16 peak of the GPU (for MFU), or None when unknown / on CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS if k in name), None)


class Throughput:
    """Tokens/s and MFU over the steps since the last log line, without evaluation and checkpoint time (paused)."""
    def __init__(self, dist_, flops_per_token=None):
        self.dist, self.flops_per_token = dist_, flops_per_token
        self.peak = peak_flops(dist_.device)
        self.reset()

    def reset(self):
        self.start, self.excluded, self.steps, self.tokens = time.perf_counter(), 0.0, 0, 0

    def step(self, tokens):
        """One optimizer step done, with `tokens` tokens on this rank."""
        self.steps, self.tokens = self.steps + 1, self.tokens + tokens

    @contextlib.contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - t

    def report(self):
        """{tokens_per_s, step_ms[, mfu]} of the window (collective under torchrun), then a new window."""
        seconds = max(time.perf_counter() - self.start - self.excluded, 1e-9)
        tokens = self.dist.mean(self.tokens) * self.dist.world_size  # all ranks
        rec = {"tokens_per_s": tokens / seconds, "step_ms": 1000 * seconds / max(self.steps, 1)}
        if self.peak and self.flops_per_token:
            rec["mfu"] = tokens * self.flops_per_token / seconds / (self.peak * self.dist.world_size)
        self.reset()
        return rec


TORCH_DEFAULT_THREADS = torch.get_num_threads()  # at import: torch's own choice (OMP_NUM_THREADS, or the cores)


def cpu_threads(cores, load, env, current, default=None, processes=1):
    """(threads, why) for a CPU run: the user's choice when there is one - OMP_NUM_THREADS or
    MKL_NUM_THREADS in `env` (`current`), or torch.set_num_threads called (`current` differs from
    torch's `default`; why is None) - else the `cores` minus those the 1-minute `load` takes, shared
    by `processes`, at least 1. Not torch's default (every core): its OpenMP threads spin-wait, and
    on a busy 2-core machine a run was 20x slower, while one thread costs ~35 % on an idle one."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if str(env.get(var, "")).strip():
            return current, f"from {var}={env[var]}"
    if current != (TORCH_DEFAULT_THREADS if default is None else default):
        return current, None
    free = max(1, min(cores, int((cores - load) / max(1, processes) + 0.5)))
    shared = f", shared by {processes} processes" if processes > 1 else ""
    return free, f"{cores} cores, 1-minute load {load:.1f}{shared}; OMP_NUM_THREADS=N chooses"


def use_cpu_threads(processes=1):
    """Set torch's intra-op threads by `cpu_threads`; returns the line saying what, why and how to override it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    threads, why = cpu_threads(cores, load, os.environ, torch.get_num_threads(), processes=processes)
    if why is None:
        return None
    torch.set_num_threads(threads)
    return f"CPU threads: {threads} ({why})"


CPU_PARAMS_LIMIT = 100e6   # device=auto without a GPU refuses a model at least this large
BYTES_PER_PARAM = 16       # fp32 weights + gradients + AdamW's two moments


def check_auto_device(cfg, params=None):
    """device=auto without CUDA falls back to the CPU; refused, before any data or model is loaded,
    when the run was meant for GPUs: several processes (torchrun), or `params` >= CPU_PARAMS_LIMIT
    (None: unknown). Refused, not warned: 8 CPU ranks of a 400M model can swap a machine to a halt
    before anyone reads a warning, and a deliberate CPU run needs one flag (--device=cpu)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if cfg["device"] != "auto" or torch.cuda.is_available():
        return
    if world <= 1 and (params is None or params < CPU_PARAMS_LIMIT):
        return
    model = f"a {params / 1e6:,.{0 if params >= 1e7 else 1}f}M-parameter model" if params else "the model"
    if world > 1:
        each = BYTES_PER_PARAM * params / (world if cfg.get("fsdp") else 1) / 1e9 if params else None
        what = f"{world} processes would each train {model} on the CPU (gloo)" + (
            f", ~{each:.1f} GB each with AdamW, {each * world:.0f} GB in all" if each else "")
    else:
        what = f"{model} would train on the CPU (~{BYTES_PER_PARAM * params / 1e9:.1f} GB with AdamW, slowly)"
    raise ConfigError(f"device=auto found no CUDA GPU: {what}; run it on a GPU machine, or pass --device=cpu to "
                      "train on the CPU anyway")
