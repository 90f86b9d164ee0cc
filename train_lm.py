"""Pretrain a Transformer on token shards: causal LM (the LLaMA decoders of the SimReg paper),
masked LM (the encoders of the MLM-vs-CLM paper), or CLM for the first part of training and MLM
after, with optional SimReg. One loop serves them all; 1 to N GPUs with torchrun.

    python train_lm.py configs/tiny_lm.py                                   # CPU, a minute
    torchrun --nproc_per_node=8 train_lm.py configs/llama_350m_simreg.py
    python train_lm.py configs/eurobert_210m_mlm.py --clm_fraction=0.25      # CLM -> MLM 25/75

Every default below can be overridden by a configs/*.py file and by --key=value flags (unknown keys
and wrong types are errors). Restarting the same command resumes from the newest complete
checkpoint in out_dir; SIGTERM saves a checkpoint and exits (status 143).
"""
import math
import sys
from collections import namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoint
import cli
import fast_paths
import training
from data import manifest
from data.preflight import check_data, check_ids, check_tokenizer
from data.shards import TokenShardLoader, shard_paths, validation_batches
from data.tokenizer import shards_tokenizer
from fast_paths import host_side
from hf.models import from_pretrained, load_tokenizer
from model import FAMILY_TRAITS, ModelConfig, Transformer, lm_losses, untie_mlm_head
from model import IGNORE_INDEX as IGNORE  # -100: the label of positions outside the loss
from simreg import interclass_angle, simreg_loss
from throughput import check_auto_device, flops_per_token
from cli import ANY, ConfigError, count, fixed, free, interval, one_of

# ---- Masked LM's rules by name: which tokens are selected, what a selected token becomes ---------


# How mlm_mask masks: the probability `ratio` and the rules of MASK_SELECTION and MASK_REPLACEMENT
# by name, the mask id, the ids never selected (a tensor), the vocabulary size and, for the rules
# that need the tokenizer, `continues`: per id, whether it continues the word before it (a
# WordPiece "##" piece; None without a tokenizer). masking(cfg, model, tokenizer) makes it, once.
Masking = namedtuple("Masking", "ratio selection replacement mask_id never_mask vocab_size continues",
                     defaults=(None,))


def select_whole_words(x, maskable, spec, g):
    """BERT's whole-word masking: a word, a token and the "##" pieces after it, is selected as one
    unit, each with probability `ratio` (the draw at its first token), so the fraction of tokens
    selected stays near `ratio` whatever the words' lengths."""
    # a word starts at a token that is no "##" piece, and at a special token and the token after it
    starts = ~spec.continues.to(x.device)[x] | ~maskable | F.pad(~maskable[:, :-1], (1, 0), value=True)
    positions = torch.arange(x.shape[1], device=x.device).expand_as(x)
    first = torch.where(starts, positions, 0).cummax(dim=1).values   # each token's word's first position
    draw = torch.rand(x.shape, generator=g, device=x.device) < spec.ratio
    return draw.gather(1, first) & maskable


MASK_SELECTION = {  # (tokens, maskable, spec, generator) -> the selected positions m
    # m_t ~ Bernoulli(ratio) for every maskable token, each on its own
    "token": lambda x, maskable, spec, g: (torch.rand(x.shape, generator=g, device=x.device) < spec.ratio) & maskable,
    # m_t = m_w(t) ~ Bernoulli(ratio) per word w (Devlin et al., BERT's whole-word masking release)
    "word": select_whole_words,
}
SELECTION_NEEDS_WORDS = {"word"}   # the selections that need `continues` from a WordPiece tokenizer


def replace_80_10_10(x, chosen, spec, g):
    """BERT: a selected token becomes [MASK] with probability 0.8, a random token with 0.1, itself with 0.1."""
    r = torch.rand(x.shape, generator=g, device=x.device)
    rand_tok = torch.randint(spec.vocab_size, x.shape, generator=g, device=x.device)
    return torch.where(chosen & (r < 0.8), spec.mask_id, torch.where(chosen & (r < 0.9), rand_tok, x))


MASK_REPLACEMENT = {  # (tokens, selected, spec, generator) -> the model's inputs x̃
    "mask": lambda x, chosen, spec, g: torch.where(chosen, spec.mask_id, x),  # x̃_t = [MASK] where m_t (the paper)
    "80_10_10": replace_80_10_10,
}


# ---- Settings: per key its default, what it accepts, whether a resumed run keeps it (fixed) or may
# change it (free), its help; training.shared: the keys both loops share, with this script's defaults

SETTINGS = cli.Settings(
    dict(**training.shared(out_dir="out/lm", resume="auto", accept_changed_data=False),
         init_from=fixed("scratch", ANY, "scratch | hf:org/name | a local HF folder (continued pretraining)")),
    "model (from scratch); sizes of the LLaMA family by default", dict(
        family=fixed("llama", one_of(FAMILY_TRAITS), "llama: a causal decoder; eurobert: its block, bidirectional"),
        vocab_size=fixed(50304, count(1), "GPT-2's 50257 padded to a multiple of 128 for fast matmuls"),
        **fixed(..., count(1)).each(d_model=768, n_layers=12, n_heads=12), n_kv_heads=fixed(0, count(0)),
        **fixed(..., count(1)).each(d_ff=2048, max_seq_len=2048),
        rope_theta=fixed(10000.0, interval("(0, inf)")), norm_eps=fixed(1e-5, interval("[0, inf)")),
        dropout=fixed(0.0, interval("[0, 1)")),
        tie_embeddings=fixed(None, cli.Rule(lambda v: None if v in (None, True, False) else "give True, False or "
                                            "None (the family's own)", bad=("yes",)),
                             "None: the family's own (bert, modernbert: tied; llama, eurobert: untied) | True | False"),
        window=fixed(0, count(0), "window > 0: layers i with i % global_every != 0 attend within +-window (ModernBERT)"),
        global_every=fixed(3, count(1), "window > 0: every global_every-th layer attends to the whole sequence"),
        n_experts=fixed(0, count(0), "Mixtral-style MoE when n_experts > 0"),
        expert_top_k=fixed(2, count(1), "MoE: the experts each token is routed to"),
        moe_aux_weight=free(0.01, interval("[0, inf)"), "MoE: the weight of the load-balancing loss"),
        z_loss=free(0.0, interval("[0, inf)"), "weight of PaLM's z-loss (model.LM_TERMS; PaLM: 1e-4); on, the "
                    "plain loss runs"),
        **fixed(..., count(-1, "-1: none"), "-1: none / taken from the checkpoint").each(
            bos_id=-1, eos_id=-1, pad_id=-1, mask_id=-1),
        tokenizer=fixed("", ANY, "a tokenizer.json (or model folder / hf: spec) to ship in checkpoints")),
    "data", dict(
        train_shards=fixed("data/fineweb_edu/fineweb_edu_train_*.bin"),
        val_shards=free("data/fineweb_edu/fineweb_edu_val_*.bin"),
        shards_from_text=free("", ANY, "a text file: missing DIR/corpus_{train,val}_*.bin shards are written from it"),
        shuffle_shards=fixed(False),
        batch_size=training.SHARED["batch_size"].given(16, "sequences per GPU per micro-step"),
        seq_len=fixed(1024, count(1)), **training.shared(grad_accum=1)),
    "objective", dict(
        objective=fixed("clm", one_of(("clm", "mlm"), "with clm_fraction for CLM -> MLM"), "causal or masked LM"),
        clm_fraction=fixed(0.0, interval("[0, 1]"), "objective=mlm: the first fraction of the steps runs CLM"),
        mask_ratio=fixed(0.3, interval("(0, 1)"), "MLM: the probability that a (non-special) token is selected"),
        mask_selection=fixed("token", one_of(MASK_SELECTION), "token: each on its own; word: a WordPiece word "
                             "with its ## pieces"),
        mask_replacement=fixed("mask", one_of(MASK_REPLACEMENT), "mask: the paper; 80_10_10: BERT")),
    "SimReg (simreg.py); applies to causal-LM steps", dict(
        simreg=free(False),
        simreg_lambda=free(-1.0, interval("[-1, inf)", "-1: the default"), "-1: 0.06 * sqrt(d_model) (simreg_lambda)"),
        simreg_tau=free(0.01, interval("(0, inf)")),
        simreg_chunk=free(512, count(0), '0: the whole sequence ("full" SimReg)'),
        simreg_layer=free(-1, count(-1, "-1: last"), "-1: last layer after the final norm; k: output of block k")),
    "optimizer and schedule", dict(
        **training.shared(lr=6e-4, min_lr_ratio=0.1, warmup_steps=700, schedule="cosine"),
        decay_fraction=free(training.WSD_DECAY_FRACTION, interval("[0, 1]"), "schedule=wsd: the last fraction of the "
                            "steps, which decays"),
        **training.shared(max_steps=10000, weight_decay=0.1, beta1=0.9, beta2=0.95, adam_eps=1e-8, grad_clip=1.0),
        decay_params=fixed("matrices", one_of(training.DECAY_PARAMS), "which parameters decay (training.adamw)"),
        head_lr_scale=fixed(1.0, interval("(0, inf)"), "the head learns at lr x this (a tied decoder keeps lr)")),
    "system", dict(
        **training.shared(device="auto", dtype="bfloat16", compile=True),
        fused=training.SHARED["fused"].given(True, "fused LM loss and MoE (fast_paths.py); False: model.py's formulas"),
        fsdp=fixed(False, ANY, "shard parameters/gradients/optimizer with FSDP2 instead of DDP (large models)"),
        fsdp_reshard=free(True, ANY, "FSDP: free each block's gathered weights after its forward (False: keep them)"),
        hsdp=free(False, ANY, "FSDP: shard within a node, replicate across nodes (multi-node runs)"),
        **training.shared(dist_timeout=60, seed=1337)),
    "logging, evaluation, checkpoints", dict(
        **training.shared(log_interval=10, eval_interval=500), eval_batches=free(20, count(1)),
        angle_min_count=free(5, count(1), "interclass_angle: the classes seen at least this often"),
        **training.shared(ckpt_interval=1000, keep_checkpoints=3, nonfinite_patience=5)))
DEFAULTS = SETTINGS.defaults  # {key: default}, for callers that need only these


# ---- Objectives ----------------------------------------------------------------------------------


def mlm_mask(tokens, spec, generator):
    """Masked-LM inputs and labels of `tokens` under `spec` (a Masking): the labels hold the original
    token at the selected positions, where the loss is taken, and IGNORE elsewhere."""
    chosen = MASK_SELECTION[spec.selection](tokens, ~torch.isin(tokens, spec.never_mask), spec, generator)
    labels = torch.where(chosen, tokens, IGNORE)
    return MASK_REPLACEMENT[spec.replacement](tokens, chosen, spec, generator), labels


@host_side
def masked_rows(labels, bucket):
    """(rows, their labels): the flat positions of the masked tokens of `labels` (B, T) and their
    targets, found on the host and padded to a multiple of `bucket` rows (row 0, label IGNORE): the
    head and the loss run at the masked positions only, with no device sync and a size that rarely
    changes (one compiled graph)."""
    flat = labels.flatten()
    rows = (flat != IGNORE).nonzero().squeeze(1)
    pad = -(-max(len(rows), 1) // bucket) * bucket - len(rows)
    return F.pad(rows, (0, pad)), F.pad(flat[rows], (0, pad), value=IGNORE)


class LMObjective(nn.Module):
    """The loss of one micro-batch (DDP, FSDP and torch.compile wrap this module, so the whole loss
    runs inside forward):

        loss = CE (+ w_z·z-loss) + λ·SimReg (causal steps, if on) + w·MoE-balance (if MoE)

    Each term is a mean over this micro-batch (over its targets for CE, over its (chunk, label)
    groups for SimReg), and gradients average micro-steps and ranks: with CLM, N ranks equal one
    process at the same global batch exactly; with MLM and SimReg, whose counts differ between
    micro-batches, approximately. CE and the other terms are model.lm_losses (LM_TERMS), fused
    where fast_paths.fused_lm_losses covers them (without the B x T x V logits, equal values)."""

    def __init__(self, model, cfg):
        super().__init__()
        self.model, self.cfg = model, cfg
        self.simreg_lambda, self.tau = simreg_lambda(cfg, model.config), cfg["simreg_tau"]
        self.chunk, self.simreg_layer = cfg["simreg_chunk"] or None, cfg["simreg_layer"]
        self.moe_aux_weight = cfg["moe_aux_weight"]
        self.extra = {"z": cfg["z_loss"]} if cfg["z_loss"] else {}   # model.LM_TERMS beside CE, that are on: weight
        self.terms = ("ce", *self.extra)
        # the fused loss where it covers every term; asked here, outside torch.compile (one line if not)
        self.fused_loss = cfg["fused"] and all(fast_paths.covers(fast_paths.fused_lm_losses, t) for t in self.terms)
        for m in model.modules():  # MoE layers: the grouped kernel, or model.py's loop over experts
            if hasattr(m, "grouped"):
                m.grouped = cfg["fused"]

    def forward(self, inputs, labels, causal: bool, use_simreg: bool, rows=None, return_hidden: bool = False):
        # L = CE (+ w_z·Z) + λ·R (SimReg on causal steps) + w·MoE balance; returns (L, its terms by name)
        keep = self.simreg_layer if use_simreg and self.simreg_layer >= 0 else None
        h, kept, aux = self.model.body(inputs, causal=causal, keep_layer=keep)
        # causal LM: a target at every position; masked LM: `labels` are those of the masked rows (masked_rows)
        scored = h if rows is None else h.flatten(0, 1)[rows]
        losses = fast_paths.fused_lm_losses if self.fused_loss else lm_losses   # the same terms; fused: no N x V logits
        terms = losses(self.model, scored, labels, self.terms)
        loss = ce = terms["ce"]
        for name, weight in self.extra.items():   # only the terms that are on: torch 2.15's inductor drops the
            loss = loss + weight * terms[name]    # fused CE's grad_fn from 1.0 * ce and from ce + 0
        sr = torch.zeros((), device=ce.device)
        if use_simreg:
            sr = simreg_loss(kept if keep is not None else h, labels, tau=self.tau, chunk_size=self.chunk)
            loss = loss + self.simreg_lambda * sr
        if torch.is_tensor(aux):
            loss = loss + self.moe_aux_weight * aux
        aux = aux.detach().float() if torch.is_tensor(aux) else torch.zeros((), device=ce.device)
        stats = {"ce": ce.detach(), "simreg": sr.detach(), "moe_aux": aux,
                 **{name: terms[name].detach() for name in self.extra}}
        return (loss, stats, h) if return_hidden else (loss, stats)


def simreg_lambda(cfg, arch):
    """λ of SimReg: the configured value, or by default 0.06·sqrt(d_model): the paper's sqrt(d) form
    with the constant of a measured sweep (docs/simreg.md, "λ"). Tune λ for a new scale."""
    return cfg["simreg_lambda"] if cfg["simreg_lambda"] >= 0 else 0.06 * math.sqrt(arch.d_model)


def step_objective(cfg, step):
    """(causal?, simreg?) at optimizer step `step`: the CLM -> MLM switch happens exactly at
    round(clm_fraction * max_steps)."""
    # CLM -> MLM: causal next-token steps for t < round(f · T), then bidirectional MLM
    causal = cfg["objective"] == "clm" or step < round(cfg["clm_fraction"] * cfg["max_steps"])
    return causal, cfg["simreg"] and causal


def mask_generator(cfg, step, micro, rank):
    """MLM masks are drawn on the host from a generator seeded by (seed, step, micro-step, rank):
    reproducible after a resume without saving any RNG state, different on every rank, the same
    on every device type, and nothing is read back from the GPU to count them (masked_rows)."""
    return torch.Generator().manual_seed(((cfg["seed"] * 1_000_003 + step) * 1009 + micro) * 8191 + rank)


# ---- Setup helpers -------------------------------------------------------------------------------


def opt_id(v):
    return None if v is None or v < 0 else v


def model_config(cfg):
    """The architecture (ModelConfig) of a model trained from scratch with the run config `cfg`."""
    fam = cfg["family"]
    tie = {} if cfg["tie_embeddings"] is None else {"tie_embeddings": cfg["tie_embeddings"]}
    local = [i for i in range(cfg["n_layers"]) if i % cfg["global_every"]] if cfg["window"] else []
    return ModelConfig(**{**FAMILY_TRAITS[fam], "family": "mixtral" if cfg["n_experts"] and fam == "llama" else fam,
                          "vocab_size": cfg["vocab_size"], "d_model": cfg["d_model"], "n_layers": cfg["n_layers"],
                          "n_heads": cfg["n_heads"], "n_kv_heads": cfg["n_kv_heads"] or None, "d_ff": cfg["d_ff"],
                          "max_seq_len": cfg["max_seq_len"], "rope_theta": cfg["rope_theta"],
                          "norm_eps": cfg["norm_eps"], **tie, "window": cfg["window"] or None, "local_layers": local,
                          "dropout": cfg["dropout"], "n_experts": cfg["n_experts"], "expert_top_k": cfg["expert_top_k"],
                          "bos_id": opt_id(cfg["bos_id"]), "eos_id": opt_id(cfg["eos_id"]),
                          "pad_id": opt_id(cfg["pad_id"]), "mask_id": opt_id(cfg["mask_id"])})


def build_model(cfg, resume_folder):
    if resume_folder is not None:  # the run's dropout, as when it started (a checkpoint's is never taken)
        return from_pretrained(resume_folder / "model", dropout=cfg["dropout"])
    if cfg["init_from"] != "scratch":  # continued pretraining from an existing checkpoint
        model = from_pretrained(cfg["init_from"], dropout=cfg["dropout"])
        return untie_mlm_head(model) if cfg["tie_embeddings"] is False else model  # (its own tie otherwise)
    with torch.device("meta"):  # the weights are drawn later, on the training device (init_weights)
        return Transformer(model_config(cfg))


def check_config(cfg):
    """Every key (its rule in SETTINGS), then the keys together, before anything is read or created."""
    cli.check_values(cfg, SETTINGS.rules)
    if cfg["objective"] == "clm" and cfg["clm_fraction"] not in (0.0, 1.0):
        raise ConfigError("clm_fraction applies to objective='mlm' (CLM first, then MLM); objective='clm' is CLM "
                          "throughout")
    if cfg["simreg"] and cfg["objective"] == "mlm" and cfg["clm_fraction"] == 0:
        raise ConfigError("simreg=True regularises next-token prediction: it needs causal steps (objective='clm' "
                          "or clm_fraction > 0)")
    if cfg["init_from"] == "scratch":
        check_model(cfg, model_config(cfg))


def check_model(cfg, arch):  # from scratch: in check_config; init_from or a checkpoint: once loaded
    training.check_length(arch, "seq_len", cfg["seq_len"])
    if cfg["simreg"] and cfg["simreg_layer"] >= arch.n_layers:
        raise ConfigError(f"simreg_layer={cfg['simreg_layer']}: the model has {arch.n_layers} blocks: use one of "
                          f"0..{arch.n_layers - 1}, or -1 (the last, after the final norm)")


# ---- Evaluation ----------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(cfg, proc, objective, step, spec):
    """Validation loss of the current objective on the fixed validation batches (and, for causal
    steps, the inter-class angle of the final embeddings: the SimReg paper's analysis, over the
    first batches of every rank). Runs through `objective` (not model.body) so that FSDP's hooks
    gather the parameters."""
    model = objective.model
    causal, use_simreg = step_objective(cfg, step)
    model.eval()
    losses, hs, ys = [], [], []
    batches = validation_batches(cfg["val_shards"], cfg["batch_size"], cfg["seq_len"], cfg["eval_batches"],
                                 proc.rank, proc.world_size, vocab_size=model.config.vocab_size)
    for i, (x, y) in enumerate(batches):
        rows = None
        if not causal:  # the same masks at every evaluation
            x, y = mlm_mask(x, spec, torch.Generator().manual_seed(10_000 + i))
            rows, y = (t.to(proc.device) for t in masked_rows(y, mlm_bucket(cfg)))
        x, y = x.to(proc.device), y.to(proc.device)
        with training.autocast(proc.device, cfg["dtype"]):
            _, stats, h = objective(x, y, causal, False, rows=rows, return_hidden=True)
        losses.append(stats["ce"].item())
        if causal and len(hs) < 4:
            hs.append(h.float().flatten(0, 1).cpu())
            ys.append(y.flatten().cpu())
    model.train()
    from torch.distributed.fsdp import FSDPModule
    if isinstance(objective, FSDPModule):
        # FSDP2 keeps the root's parameters gathered after a forward for its backward; with none to
        # follow, the next checkpoint's get_optimizer_state_dict would not find the sharded ones
        objective.reshard()
    out = {"val_loss": proc.mean(sum(losses) / len(losses))}
    if hs:  # every rank's embeddings, so that 1 and N processes measure the same classes
        h, y = proc.gather(torch.cat(hs)), proc.gather(torch.cat(ys))
        angle, n_classes = interclass_angle(h, y, min_count=cfg["angle_min_count"])
        out.update(interclass_angle=float(angle), angle_classes=int(n_classes))
    return out


def mlm_bucket(cfg):
    """Masked rows are padded to a multiple of this (masked_rows): 1/16 of a micro-batch's tokens."""
    return max(64, cfg["batch_size"] * cfg["seq_len"] // 16)


def masking(cfg, model, tokenizer=None):
    """The run's Masking (mlm_mask): its keys, and the model's mask id, special ids and vocabulary;
    for a selection by words, which ids continue a word (the tokenizer's WordPiece "##" pieces): a
    tokenizer without them is refused here, before step 1."""
    arch, continues = model.config, None
    if cfg["objective"] == "mlm" and cfg["mask_selection"] in SELECTION_NEEDS_WORDS:
        prefix = getattr(getattr(tokenizer, "model", None), "continuing_subword_prefix", None)
        continues = torch.zeros(arch.vocab_size, dtype=torch.bool)
        if prefix:
            pieces = [i for t, i in tokenizer.get_vocab().items() if t.startswith(prefix) and i < len(continues)]
            continues[pieces] = True
        if not continues.any():
            what = "no tokenizer (give --tokenizer)" if tokenizer is None else "a tokenizer without WordPiece pieces"
            raise cli.ConfigError(f"mask_selection={cfg['mask_selection']!r} selects whole words, a token and the "
                                  f"'##' pieces after it, but this run has {what}; use mask_selection='token', or "
                                  "a WordPiece tokenizer (BERT's)")
    special = {arch.bos_id, arch.eos_id, arch.pad_id, arch.cls_id, arch.sep_id, arch.mask_id} - {None}
    return Masking(cfg["mask_ratio"], cfg["mask_selection"], cfg["mask_replacement"], arch.mask_id,
                   torch.tensor(sorted(special), dtype=torch.long), arch.vocab_size, continues)


# ---- Training ------------------------------------------------------------------------------------


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg = cli.parse_config(SETTINGS, argv, __file__)
    typed = {a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    if {"train_shards", "val_shards"} & typed and "shards_from_text" not in typed:
        cfg["shards_from_text"] = ""  # shards named here are the user's: a config's sample text never fills them
    check_config(cfg)
    check_auto_device(cfg, build_model(cfg, None).num_params() if cfg["init_from"] == "scratch" else None)
    # SimReg at tau=0.01 drives far-apart softmax weights into fp32 denormals, which are ~100x
    # slower on CPUs; flushing them to zero changes nothing measurable (GPUs flush anyway).
    torch.set_flush_denormal(True)
    shards = check_data(cfg)
    if cfg["init_from"] == "scratch":
        check_ids(cfg, model_config(cfg), shards)
    with training.Run(cfg) as run:
        step = train(cfg, run, shards)
    run.exit_if_preempted()  # a SIGTERM saved and stopped the run: exit 128 + 15, not 0
    return step


def init_weights(model, cfg, device):
    """A model built on the meta device gets its memory on `device` and its initial weights, drawn
    from the run's seed: the same values on every rank (its own slices of them under FSDP)."""
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives every module its own tensor: a tied head would train apart from its table
    model.init_weights(torch.Generator().manual_seed(cfg["seed"]))


def train(cfg, run, shards):
    """The training run for a parsed, checked config, inside its `training.Run`; `shards`: the
    data's facts (check_data)."""
    proc, ckpts = run.dist, run.checkpoints

    # ---- the model (from scratch, init_from, or the checkpoint of a resumed run) and its ids
    model, state, opt_state, rng, resume = checkpoint.resume_or_build(
        ckpts, cfg["resume"], lambda f: build_model(cfg, f), sharded_optimizer=cfg["fsdp"], device=proc.device)
    changes = resume and checkpoint.check_resumed_config(state["config"], cfg, SETTINGS, run.say)
    fresh = next(model.parameters()).is_meta  # a new model: no weights yet
    if cfg["head_lr_scale"] != 1 and model.head.decoder.weight is model.embed.tok.weight:  # adamw leaves the table
        own = sum(p.numel() for p in model.head.parameters() if p is not model.embed.tok.weight)
        run.say(f"note: head_lr_scale={cfg['head_lr_scale']:g}: the head is tied to the token table, which keeps lr; "
                f"{own:,} values of the head's own learn at that rate (tie_embeddings=False unties the head)")
    if not fresh:
        model.to(proc.device)
    arch = model.config
    for name in ("bos_id", "eos_id", "pad_id", "mask_id"):  # ids set in the run's config win
        if opt_id(cfg[name]) is not None:
            setattr(arch, name, cfg[name])
    check_ids(cfg, arch, shards)  # a checkpoint's ids (init_from, resume) may differ from the config's
    check_model(cfg, arch)
    known = cfg["tokenizer"] or shards_tokenizer(shards, model.source)  # else the source's files, if any
    tokenizer = load_tokenizer(known) if known else None
    if tokenizer is not None:
        check_tokenizer(cfg, tokenizer, arch, shards)
    spec = masking(cfg, model, tokenizer)   # once: the evaluations mask by it too

    # ---- the loss module (DDP or FSDP2, compile), the optimizer, the data, the loop's bookkeeping
    objective = LMObjective(model, cfg)
    if fresh and not cfg["fsdp"]:
        init_weights(model, cfg, proc.device)
    train_obj = training.parallelize(objective, model.layers, cfg, proc)
    if fresh and cfg["fsdp"]:  # sharded first, so that no rank ever holds the whole model
        init_weights(model, cfg, proc.device)
    model.train()
    optimizer = training.adamw(model, cfg["lr"], cfg["weight_decay"], (cfg["beta1"], cfg["beta2"]), cfg["adam_eps"],
                               proc.device, fused=True, decay_params=cfg["decay_params"],
                               head_lr_scale=cfg["head_lr_scale"])
    checkpoint.load_optimizer_state(objective, optimizer, opt_state, fsdp=cfg["fsdp"])
    loader = TokenShardLoader(cfg["train_shards"], cfg["batch_size"], cfg["seq_len"], proc.rank, proc.world_size,
                              seed=cfg["seed"], shuffle=cfg["shuffle_shards"], vocab_size=arch.vocab_size)
    val_data = None
    if cfg["eval_interval"]:  # the validation shards by content, like the training shards (data/manifest.py)
        val_data = manifest.identity(shard_paths(cfg["val_shards"]))
    if resume:
        loader.load_state_dict(state["loader"], cfg["accept_changed_data"])  # the shards by content too
        if state.get("val_data") is not None and val_data is not None:
            checkpoint.check_resumed_data(state["val_data"], val_data, cfg, f"val_shards {cfg['val_shards']}", run.say)
    accum, tokens_at = checkpoint.global_batch(state, cfg, proc.world_size, run.say)  # kept on another world size
    tokens_per_step = accum * cfg["batch_size"] * cfg["seq_len"] * proc.world_size

    def save(step, final, periodic):
        weights, opt_state = checkpoint.checkpoint_state(model, objective, optimizer, proc, fsdp=cfg["fsdp"])
        trainer = {"config": cfg, "loader": loader.state_dict(), "skipped_steps": loop.guard.skipped,
                   "tokens": tokens_at(step), "world_size": proc.world_size, "grad_accum": accum, "val_data": val_data}
        ckpts.save(step, model, opt_state, trainer, tokenizer=tokenizer, sharded_optimizer=cfg["fsdp"],
                   model_state=weights if cfg["fsdp"] else None, final=final, periodic=periodic)

    loop = training.Loop(cfg, run, state, rng, resume, flops_per_token(arch, cfg["seq_len"]), save, changes,
                         hint="SimReg lambda too high, " if cfg["simreg"] else "")
    if proc.master:
        print(f"{arch.model_type}: {model.num_params() / 1e6:.1f}M parameters; {proc.world_size} process(es) on "
              f"{proc.device}; {tokens_per_step:,} tokens per step")
    clm = 1.0 if cfg["objective"] == "clm" else cfg["clm_fraction"]  # the share of causal steps
    causal_flops, mlm_flops = (flops_per_token(arch, cfg["seq_len"], r) for r in (1.0, cfg["mask_ratio"]))
    loop.budget(tokens_per_step, loader.batches_per_epoch() * loader.global_tokens, "tokens",
                clm * causal_flops + (1 - clm) * mlm_flops)

    while loop.running():
        step = loop.step
        causal, use_simreg = step_objective(cfg, step)
        # MLM computes the vocabulary logits at its masked positions only: fewer FLOPs per token
        loop.throughput.flops_per_token = flops_per_token(arch, cfg["seq_len"], 1.0 if causal else cfg["mask_ratio"])
        lr = loop.set_lr(optimizer)
        batches = loop.read(next(loader) for _ in range(accum))  # host memory; a bad shard saves, stops
        totals, loss_sum = {}, 0.0
        for micro, (x, y) in enumerate(batches):
            rows = None
            if not causal:  # masks drawn on the host from (seed, step, micro, rank): the same after a resume
                x, y = mlm_mask(x, spec, mask_generator(cfg, step, micro, proc.rank))
                rows, y = masked_rows(y, mlm_bucket(cfg))
                rows = training.to_device(rows, proc.device)
            x, y = training.to_device(x, proc.device), training.to_device(y, proc.device)
            training.sync_gradients(train_obj, micro == accum - 1)  # reduce after the last micro-step
            with training.autocast(proc.device, cfg["dtype"]):
                loss, stats = train_obj(x, y, causal, use_simreg, rows)
            (loss / accum).backward()
            totals = {name: totals.get(name, 0) + value / accum for name, value in stats.items()}
            loss_sum = loss_sum + loss.detach() / accum
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"] or math.inf)
        optimizer.found_inf = loop.guard.found_inf(loss_sum, grad_norm)  # a non-finite step is skipped on the device
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loop.finish_step(tokens_per_step // proc.world_size, loss=loss_sum, grad_norm=grad_norm, **totals)

        if loop.log_due():
            values = {name: proc.mean(v) if name != "grad_norm" else v for name, v in loop.sync().items()}
            rec = dict(step=loop.step, loss=values["loss"], ce=values["ce"], lr=lr, grad_norm=values["grad_norm"],
                       objective="clm" if causal else "mlm", tokens=tokens_at(loop.step),
                       skipped_steps=loop.guard.skipped, **loop.throughput.report())
            if use_simreg:  # R and its weighted share λ·R of the loss, beside ce: the balance of the two
                rec.update(simreg=values["simreg"], simreg_weighted=objective.simreg_lambda * values["simreg"])
            if arch.n_experts:
                rec["moe_aux"] = values["moe_aux"]
            rec.update({name: values[name] for name in objective.extra})  # z-loss, if on
            loop.log.write(**rec)
            loop.bar.set_postfix(loss=f"{rec['loss']:.3f}", lr=f"{lr:.2e}")
        if loop.eval_due():
            loop.evaluate(lambda: evaluate(cfg, proc, objective, loop.step - 1, spec))
        if loop.checkpoint():
            break
    loop.close()
    loader.close()
    return loop.step


if __name__ == "__main__":
    cli.run_cli(main)
