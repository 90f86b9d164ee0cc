"""Training-step speed of our model.py against Hugging Face transformers, measured in one run.

    python tests/benchmarks/bench_model.py                       # 7 families at 8 x 512 (long on 2 cores)
    python tests/benchmarks/bench_model.py --quick               # tiny shapes: a smoke run in ~1 minute
    python tests/benchmarks/bench_model.py --families bert,llama --rounds 7 --threads 2
    python tests/benchmarks/bench_model.py --train-lm --simreg   # train_lm step vs LlamaForCausalLM
    python tests/benchmarks/bench_model.py --families llama --profile   # where the time goes
    python tests/benchmarks/bench_model.py --families modernbert --attn-impl dense,packed  # our paths
    python tests/benchmarks/bench_model.py --device cuda --padding both --rounds 10          # a GPU
    python tests/benchmarks/bench_model.py --device cuda --padding both --rounds 10 --compile

What is compared. For each family a transformers model is built at the shape below (random
weights, dropout 0, fp32, attn_implementation="sdpa"), saved with save_pretrained and loaded by our
`from_pretrained`, so both hold identical weights (checked: logits agree before timing).

    bert        BERT-base: 12 layers, d 768, 12 heads, FF 3072, vocab 30522
    modernbert  ModernBERT-base with 8 layers: d 768, FF 1152 (GeGLU), vocab 50368, window 128
                (+-64), every third layer global
    llama       ~100M LLaMA: 12 layers, d 768, 12 heads, SwiGLU 2048, vocab 32000, untied head
    roberta     RoBERTa-base (vocab 50265, fairseq positions)
    distilbert  DistilBERT-base (6 layers)
    gte         GTE-MLM-base (RoPE, GeGLU 3072, vocab 30528)
    eurobert    EuroBERT-210m shape (12 layers, d 768, vocab 128256: the head is half the model)

One timed step is forward + loss + loss.backward() + zero_grad (no optimizer step: it costs the
same for both, the parameter count being equal, and would only dilute the ratio). The loss is the
same function of the logits for both: masked-LM cross-entropy on 30 % of the real tokens for the
encoders, whose batches are padded (random lengths, mean 70 % of --seq, i.e. ~30 % padding); next-
token cross-entropy on every position for the causal LM, whose batches are full (as in pretraining).
--padding yes / no / both overrides that per family (unpadded batches still pass an all-ones
attention mask, as a tokenizer gives it: both implementations must notice that nothing is padded).
--attn-impl times one "ours" per listed model.ModelConfig.attn_impl (default: auto), each against
the same transformers step, so that e.g. dense vs packed is measured in one run.

On a GPU (--device cuda) both models keep fp32 weights and run under bf16 autocast, as train_lm.py
and train_splade.py do; --compile wraps both in torch.compile (compile time is spent in the warm-up
steps, so use --warmup 3 or more); each timed step ends with torch.cuda.synchronize(); peak memory
is the allocator's peak during one step minus what was allocated before it.

--train-lm times a train_lm.py step instead: our LLaMA inside `LMObjective` (CE, and with --simreg
also CE + SimReg, chunk 512) against `LlamaForCausalLM(input_ids, labels=...)`, each followed by
gradient clipping and an AdamW step (training.adamw for both), at the llama shape, no padding.

How it is timed. This machine is shared and its load changes from minute to minute, so the
implementations run in turn, round by round (the order alternates, ABBA, to cancel drift), after
--warmup untimed steps each; medians are reported, and the ratio is the median of the per-round
ratios ours / transformers (< 1: ours is faster). Tokens/s counts real (non-padding) tokens.
Peak memory is measured in fresh subprocesses, one per model: resident memory just before a
training step (weights and batch loaded and paged in) is subtracted from the peak resident memory
(VmHWM, reset through /proc/self/clear_refs) during one step; it covers activations, gradients and
temporaries, as the allocator sees them.
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers as tf  # noqa: E402
from tqdm import tqdm  # noqa: E402

import model as M  # noqa: E402
from bench_simreg import proc_status_bytes, reset_peak_rss  # noqa: E402  (Linux /proc readers)
from hf.models import HF_FAMILIES, from_pretrained  # noqa: E402

IGNORE = M.IGNORE_INDEX  # -100, also what transformers ignores
MLM_RATIO = 0.3     # fraction of real tokens that carry a masked-LM label
MIN_LENGTH = 0.4    # encoder lengths are uniform in [0.4, 1] x seq: mean 0.7, i.e. ~30 % padding
DEFAULT_FAMILIES = "bert,modernbert,llama,roberta,distilbert,gte,eurobert"

# ------------------------------------------------------------------------------------------------
# The models: transformers classes and configs at the benchmark shapes
# ------------------------------------------------------------------------------------------------

# (d_model, layers, heads, FF, vocab) per family; --quick shrinks every one to the same tiny shape
FULL_SHAPES = {
    "bert": (768, 12, 12, 3072, 30522),
    "modernbert": (768, 8, 12, 1152, 50368),
    "llama": (768, 12, 12, 2048, 32000),
    "roberta": (768, 12, 12, 3072, 50265),
    "distilbert": (768, 6, 12, 3072, 30522),
    "gte": (768, 12, 12, 3072, 30528),
    "eurobert": (768, 12, 12, 3072, 128256),
}
QUICK_SHAPE = (128, 2, 4, 256, 1000)


def hf_model(family, quick, seq):
    """A transformers model (random weights, dropout 0, sdpa attention) of `family`."""
    d, L, H, ff, V = QUICK_SHAPE if quick else FULL_SHAPES[family]
    bert_like = dict(vocab_size=V, hidden_size=d, num_hidden_layers=L, num_attention_heads=H,
                     intermediate_size=ff, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if family == "bert":
        cls, cfg = tf.BertForMaskedLM, tf.BertConfig(**bert_like)
    elif family == "roberta":
        cls, cfg = tf.RobertaForMaskedLM, tf.RobertaConfig(**bert_like, max_position_embeddings=seq + 2,
                                                             type_vocab_size=1, pad_token_id=1)
    elif family == "distilbert":
        cls, cfg = tf.DistilBertForMaskedLM, tf.DistilBertConfig(vocab_size=V, dim=d, n_layers=L, n_heads=H,
                                                                  hidden_dim=ff, dropout=0.0, attention_dropout=0.0)
    elif family == "gte":
        cls, cfg = tf.GteForMaskedLM, tf.GteConfig(**bert_like, type_vocab_size=0, pad_token_id=0)
    elif family == "modernbert":
        # the real window (128, i.e. +-64) unless --quick's short sequences would make it global
        window = 128 if seq > 256 else max(4, seq // 4)
        cls, cfg = tf.ModernBertForMaskedLM, tf.ModernBertConfig(
            vocab_size=V, hidden_size=d, num_hidden_layers=L, num_attention_heads=H, intermediate_size=ff,
            local_attention=window, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    elif family == "eurobert":
        cls, cfg = tf.EuroBertForMaskedLM, tf.EuroBertConfig(
            vocab_size=V, hidden_size=d, num_hidden_layers=L, num_attention_heads=H, intermediate_size=ff,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3)
    elif family == "llama":
        cls, cfg = tf.LlamaForCausalLM, tf.LlamaConfig(
            vocab_size=V, hidden_size=d, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=H,
            intermediate_size=ff, max_position_embeddings=max(2048, seq), pad_token_id=0, tie_word_embeddings=False)
    else:
        raise ValueError(f"--families: unknown family {family!r}; choose from {', '.join(FULL_SHAPES)}")
    torch.manual_seed(0)
    model = cls._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return model


def load_hf(folder, causal):
    auto = tf.AutoModelForCausalLM if causal else tf.AutoModelForMaskedLM
    return auto.from_pretrained(folder, attn_implementation="sdpa", dtype=torch.float32)


def is_causal_family(family):
    return HF_FAMILIES[family].causal


# ------------------------------------------------------------------------------------------------
# Batches and one training step
# ------------------------------------------------------------------------------------------------


def make_batch(family, vocab, pad_id, batch, seq, padded=None, seed=0):
    """Encoders: MLM labels on 30 % of the real tokens; causal LM: next-token labels. `padded`
    (default: encoders yes, causal LM no) gives random lengths with ~30 % padding; unpadded batches
    carry an all-ones mask."""
    g = torch.Generator().manual_seed(seed)
    padded = not is_causal_family(family) if padded is None else padded
    lengths = torch.randint(round(MIN_LENGTH * seq), seq + 1, (batch,), generator=g) if padded else \
        torch.full((batch,), seq)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    tokens = torch.randint(5, vocab, (batch, seq + 1), generator=g)
    ids = tokens[:, :-1].clone()
    ids[mask == 0] = pad_id
    if is_causal_family(family):  # the target of the last real token of a padded row is padding
        labels = torch.where(torch.arange(seq)[None, :] < lengths[:, None] - (1 if padded else 0), tokens[:, 1:], IGNORE)
    else:
        chosen = (torch.rand(batch, seq, generator=g) < MLM_RATIO) & mask.bool()
        labels = torch.where(chosen, ids, IGNORE)
    return {"ids": ids, "mask": mask, "labels": labels}


def real_tokens(batch):
    return batch["ids"].numel() if batch["mask"] is None else int(batch["mask"].sum())


def ours_logits(model, batch):
    return model(batch["ids"], attention_mask=batch["mask"])


def hf_logits(model, batch):
    return model(input_ids=batch["ids"], attention_mask=batch["mask"]).logits


def amp(device):
    """bf16 autocast on a GPU (weights stay fp32, as in training); fp32 on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def training_step(model, logits_fn, batch, device="cpu"):
    """forward + the shared loss + backward; gradients dropped as an optimizer loop would."""
    with amp(device):
        logits = logits_fn(model, batch)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE)
    loss.backward()
    model.zero_grad(set_to_none=True)
    sync(device)


@torch.no_grad()
def check_same_logits(ours, hf, batch, rows=2):
    """Guards the comparison: both models must compute the same function on the same weights."""
    small = {k: (v[:rows] if v is not None else None) for k, v in batch.items()}
    a, b = ours_logits(ours, small), hf_logits(hf, small)
    real = torch.ones(a.shape[:2], device=a.device) if small["mask"] is None else small["mask"]
    diff = ((a - b).abs() * real[..., None]).max().item()
    if diff > 1e-3:
        raise AssertionError(f"our logits differ from transformers' by {diff:.2e}: the benchmark would compare "
                             "different computations")
    return diff


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------


def interleaved_times(steps, rounds, warmup, desc):
    """Seconds per step of each callable in `steps`, run in turn round by round (ABBA order)."""
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times = {name: [] for name in names}
    for r in tqdm(range(rounds), desc=desc, leave=False, dynamic_ncols=True):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def paired_ratio(times, a, b):
    """Median over rounds of time(a) / time(b): both ran within seconds of each other in a round."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def profile_step(step, label, rows=15):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    print(f"\n--- profile: {label} (one step, sorted by self CPU time) ---")
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=rows,
                                                             max_name_column_width=40, max_shapes_column_width=60))


# ------------------------------------------------------------------------------------------------
# Peak memory: one fresh subprocess per model
# ------------------------------------------------------------------------------------------------


def memory_child(args):
    """Runs in a subprocess: load one model, page everything in, then one step under a fresh VmHWM."""
    torch.set_num_threads(args.threads)
    family, impl, folder, padded = args.memory_child
    causal = is_causal_family(family)
    model = from_pretrained(folder) if impl != "hf" else load_hf(folder, causal)
    if impl != "hf":
        model.config.attn_impl = impl
    model.train()
    cfg = json.loads((Path(folder) / "config.json").read_text())
    batch = make_batch(family, cfg["vocab_size"], cfg.get("pad_token_id") or 0, args.batch, args.seq, padded == "1")
    with torch.no_grad():  # weights may be memory-mapped: make them resident before the baseline
        for p in model.parameters():
            p.sum()
    reset_peak_rss()
    before = proc_status_bytes("VmRSS")
    training_step(model, hf_logits if impl == "hf" else ours_logits, batch)
    print(json.dumps({"peak_delta_mb": (proc_status_bytes("VmHWM") - before) / 2**20}))


def peak_memory_mb(family, impl, folder, padded, args, step=None):
    """Peak step memory: on CUDA the allocator's peak during `step()`, on the CPU in a fresh process."""
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    cmd = [sys.executable, __file__, "--memory-child", family, impl, str(folder), "1" if padded else "0",
           "--batch", str(args.batch), "--seq", str(args.seq), "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.returncode:
        raise RuntimeError(f"memory subprocess for {family}/{impl} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_delta_mb"]


# ------------------------------------------------------------------------------------------------
# The two modes
# ------------------------------------------------------------------------------------------------


def bench_family(family, padded, args, workdir):
    """One row per attn_impl of ours: its step time against transformers' on the same batch."""
    padded = not is_causal_family(family) if padded is None else padded
    hf = hf_model(family, args.quick, args.seq)
    folder = workdir / family
    hf.save_pretrained(folder)
    ours = from_pretrained(folder)
    cfg = ours.config
    batch = make_batch(family, cfg.vocab_size, cfg.pad_id or 0, args.batch, args.seq, padded)
    batch = {k: v.to(args.device) for k, v in batch.items()}
    ours.to(args.device), hf.to(args.device)
    diff = check_same_logits(ours.eval(), hf.eval(), batch)  # eager fp32, before any compile
    ours.train(), hf.train()
    run_ours, run_hf = (torch.compile(ours), torch.compile(hf)) if args.compile else (ours, hf)

    def ours_step(impl):
        def step():
            cfg.attn_impl = impl
            training_step(run_ours, ours_logits, batch, args.device)
        return step
    steps = {f"ours {impl}": ours_step(impl) for impl in args.attn_impl}
    steps["transformers"] = lambda: training_step(run_hf, hf_logits, batch, args.device)
    load = os.getloadavg()[0]
    times = interleaved_times(steps, args.rounds, args.warmup, desc=family)
    load = max(load, os.getloadavg()[0])
    if args.profile:
        for name, step in steps.items():
            profile_step(step, f"{family} {name}")
    rows = []
    hf_mem = None
    if args.memory:
        hf_mem = peak_memory_mb(family, "hf", folder, padded, args, steps["transformers"])
    for impl in args.attn_impl:
        name = f"ours {impl}"
        row = {"family": family, "padded": padded, "impl": impl, "params_m": ours.num_params() / 1e6,
               "logit_diff": diff, "load": load, "ours_ms": 1e3 * statistics.median(times[name]),
               "hf_ms": 1e3 * statistics.median(times["transformers"]), "ratio": paired_ratio(times, name, "transformers"),
               "tokens": real_tokens(batch), "round_ratios": [a / b for a, b in zip(times[name], times["transformers"])],
               "best_ratio": min(times[name]) / min(times["transformers"])}
        if args.memory:
            row["ours_mem"] = peak_memory_mb(family, impl, folder, padded, args, steps[name])
            row["hf_mem"] = hf_mem
        rows.append(row)
    return rows


def bench_train_lm(args, workdir):
    """train_lm.py's step (LMObjective + clip + AdamW) against LlamaForCausalLM with labels."""
    import train_lm
    import training
    # as train_lm.main does, for all three steps alike (SimReg's tiny softmax weights; see simreg.py)
    torch.set_flush_denormal(True)
    hf = hf_model("llama", args.quick, args.seq)
    folder = workdir / "llama"
    hf.save_pretrained(folder)
    ours = from_pretrained(folder)
    batch = make_batch("llama", ours.config.vocab_size, 0, args.batch, args.seq, padded=False)
    batch = {k: v.to(args.device) for k, v in batch.items()}
    ours.to(args.device), hf.to(args.device)
    check_same_logits(ours.eval(), hf.eval(), batch)
    ours.train(), hf.train()
    C = {**train_lm.DEFAULTS, "simreg_chunk": min(512, args.seq)}
    objective = train_lm.LMObjective(ours, C)
    x, y = batch["ids"], batch["labels"]
    with torch.no_grad():  # same loss on the same positions, else the steps would not be comparable
        ours_ce = objective(x[:2], y[:2], True, False)[0].item()
        hf_ce = hf(input_ids=x[:2], labels=y[:2], shift_labels=y[:2]).loss.item()
    if abs(ours_ce - hf_ce) > 1e-4:
        raise AssertionError(f"cross-entropy differs: ours {ours_ce:.6f}, transformers {hf_ce:.6f}")
    run_obj, run_hf = (torch.compile(objective), torch.compile(hf)) if args.compile else (objective, hf)

    # each step has its own AdamW (the two "ours" steps update the same weights: harmless for timing)
    def step_fn(model, loss_fn):
        opt = training.adamw(model, lr=1e-5, weight_decay=0.1, device=torch.device(args.device))

        def step():
            with amp(args.device):
                loss = loss_fn()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(args.device)
        return step

    steps = {"ours CE": step_fn(ours, lambda: run_obj(x, y, True, False)[0])}
    if args.simreg:
        steps["ours CE+SimReg"] = step_fn(ours, lambda: run_obj(x, y, True, True)[0])
    # shift_labels: transformers then uses our already shifted targets, so both score all T positions
    steps["transformers CE"] = step_fn(hf, lambda: run_hf(input_ids=x, labels=y, shift_labels=y).loss)
    load = os.getloadavg()[0]
    times = interleaved_times(steps, args.rounds, args.warmup, desc="train-lm")
    load = max(load, os.getloadavg()[0])
    if args.profile:
        for name, step in steps.items():
            profile_step(step, name)
    return times, real_tokens(batch), load


# ------------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------------


def print_family_table(rows, args):
    mem = args.memory
    head = ("| family | padding | ours attn_impl | params | ours ms/step | transformers ms/step | ours / transformers "
            "| ours tok/s | transformers tok/s |")
    rule = "|---|---|---|---:|---:|---:|---:|---:|---:|"
    if mem:
        head += " ours peak MB | transformers peak MB |"
        rule += "---:|---:|"
    print(head)
    print(rule)
    for r in rows:
        line = (f"| {r['family']} | {'~30 %' if r['padded'] else 'none'} | {r['impl']} | {r['params_m']:.1f}M "
                f"| {r['ours_ms']:.0f} | {r['hf_ms']:.0f} | {r['ratio']:.2f} "
                f"| {r['tokens'] / r['ours_ms'] * 1e3:,.0f} | {r['tokens'] / r['hf_ms'] * 1e3:,.0f} |")
        if mem:
            line += f" {r['ours_mem']:,.0f} | {r['hf_mem']:,.0f} |"
        print(line)


def print_train_lm_table(times, tokens):
    ref = "transformers CE"
    print("| step | ms/step | tokens/s | time / transformers |")
    print("|---|---:|---:|---:|")
    for name, t in times.items():
        ms = 1e3 * statistics.median(t)
        ratio = paired_ratio(times, name, ref)
        print(f"| {name} | {ms:.0f} | {tokens / ms * 1e3:,.0f} | {ratio:.2f} |")
    for name in times:
        if name != ref:
            print(f"\n{name} / {ref} per round: " + " ".join(f"{a / b:.2f}" for a, b in zip(times[name], times[ref])))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=DEFAULT_FAMILIES, help=f"comma-separated (default {DEFAULT_FAMILIES})")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default 8; --quick 4)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default 512; --quick 64)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5; --quick 5)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps of each model first (default 1; "
                    "--compile 3)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (both models)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (d 128, 2 layers, vocab 1000): smoke run")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: bf16 autocast, fp32 weights (default cpu: fp32)")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models (or both train_lm steps)")
    ap.add_argument("--padding", choices=("auto", "yes", "no", "both"), default="auto",
                    help="auto: encoders ~30 %% padding, the causal LM none; both: one row each")
    ap.add_argument("--attn-impl", default="auto",
                    help="comma-separated model.ModelConfig.attn_impl values, one timed 'ours' each (default auto)")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory measurements")
    ap.add_argument("--profile", action="store_true", help="also print a torch.profiler table of one step each")
    ap.add_argument("--train-lm", action="store_true", help="time train_lm's LLaMA step against LlamaForCausalLM")
    ap.add_argument("--simreg", action="store_true", help="--train-lm: also time CE + SimReg")
    ap.add_argument("--memory-child", nargs=4, metavar=("FAMILY", "IMPL", "FOLDER", "PADDED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.batch = args.batch or (4 if args.quick else 8)
    args.seq = args.seq or (64 if args.quick else 512)
    args.rounds = args.rounds or 5
    args.warmup = args.warmup if args.warmup is not None else (3 if args.compile else 1)
    args.attn_impl = [i.strip() for i in args.attn_impl.split(",") if i.strip()]
    for impl in args.attn_impl:
        if impl not in M.ATTN_IMPLS:
            ap.error(f"--attn-impl: unknown {impl!r}; choose from {', '.join(M.ATTN_IMPLS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device visible to torch")
    torch.set_num_threads(args.threads)
    tf.utils.logging.disable_progress_bar()
    if args.memory_child:
        return memory_child(args)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    for f in families:
        if f not in FULL_SHAPES:
            ap.error(f"--families: unknown family {f!r}; choose from {', '.join(FULL_SHAPES)}")
    paddings = {"auto": [None], "yes": [True], "no": [False], "both": [True, False]}[args.padding]

    print("command: python tests/benchmarks/bench_model.py " + " ".join(sys.argv[1:]))
    where = (f"{torch.cuda.get_device_name()}, bf16 autocast" if args.device == "cuda"
             else f"{torch.get_num_threads()} threads on {os.cpu_count()} CPUs, fp32")
    print(f"{time.strftime('%Y-%m-%d')}; torch {torch.__version__}, transformers {tf.__version__}; {where}; "
          f"{'torch.compile; ' if args.compile else ''}transformers attention: sdpa; batch {args.batch} x {args.seq}; "
          f"{args.warmup} warm-up + {args.rounds} interleaved rounds")
    print(f"uptime at start: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.train_lm:
            times, tokens, load = bench_train_lm(args, Path(tmp))
            print(f"\nstep = LMObjective / LlamaForCausalLM(labels) forward + backward + clip + AdamW; "
                  f"no padding; {tokens} tokens per step; max 1-min load average seen {load:.1f}\n")
            print_train_lm_table(times, tokens)
        else:
            rows = []
            for family in families:
                for padded in paddings:
                    for r in bench_family(family, padded, args, Path(tmp)):
                        rows.append(r)
                        print(f"{family} ({'padded' if r['padded'] else 'no padding'}): ours {r['impl']} "
                              f"{r['ours_ms']:.0f} ms, transformers {r['hf_ms']:.0f} ms, ratio {r['ratio']:.2f}; "
                              "per round " + " ".join(f"{x:.2f}" for x in r["round_ratios"])
                              + f"; fastest ours / fastest transformers {r['best_ratio']:.2f}"
                              + f" (logits agree to {r['logit_diff']:.1e}; load average up to {r['load']:.1f})",
                              flush=True)
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
            print("\nstep = forward + cross-entropy + backward (no optimizer); ratio = median over rounds of "
                  "ours / transformers time (< 1: ours faster); tok/s counts real (non-padding) tokens; "
                  + ("peak MB = allocator peak during one step minus what was allocated before it\n"
                     if args.device == "cuda" else
                     "peak MB = peak RSS during one step minus RSS before it, in a fresh process\n"))
            print_family_table(rows, args)
    print(f"\nuptime at end: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
