"""What train_lm.py checks before its first step: the token shards against the config, and the
special ids and shipped tokenizer against the vocabulary and the shards' headers; each failure names
the key or file, the value and the fix. And `shards_from_text`: a config's text file made into
shards on first use (the tiny configs run on a fresh clone)."""
import fcntl
import glob
import os
from pathlib import Path

from cli import ConfigError, MissingInput, where
from data.shards import ShardError, TokenShardLoader, shard_facts, shard_paths


def shards_from_text(cfg):
    """Write DIR/corpus_{train,val}_*.bin from cfg["shards_from_text"] when train_shards / val_shards are those
    globs and DIR holds no finished corpus of that text (data/text_corpus.py). One process prepares, under a
    lock on DIR/prepare.lock: other ranks or runs wait for it, then find the corpus done."""
    text = cfg.get("shards_from_text")
    folder = Path(cfg["train_shards"]).parent
    globs = [str(folder / f"corpus_{part}_*.bin") for part in ("train", "val")]
    if not text or [cfg["train_shards"], cfg["val_shards"]] != globs:
        return
    from data.text_corpus import TEXT_SPECIAL_TOKENS, TEXT_VOCAB_SIZE, prepare_text_corpus
    started = (folder / "documents.jsonl").exists()  # what text_corpus writes before the shards
    if (folder / "corpus.json").exists() and not Path(text).is_file():
        return  # prepared, and the text is gone: the shards are what the run reads
    if (folder / "corpus.json").exists() and prepare_text_corpus(text, folder, TEXT_VOCAB_SIZE, TEXT_SPECIAL_TOKENS,
                                                                 finished_only=True):
        return  # finished from this very text (by content; another text is refused)
    if glob.glob(cfg["train_shards"]) and not started and not (folder / "corpus.json").exists():
        return
    if not Path(text).is_file():
        raise MissingInput(f"shards_from_text={where(text)} does not exist: give a UTF-8 text file, or run from the "
                           "folder the config's paths are relative to (the repository root)", path=text)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        if not (folder / "corpus.json").exists():
            print(f"data: writing {folder} from {text} once (a {TEXT_VOCAB_SIZE}-id byte-level BPE and its shards, "
                  "data/text_corpus.py)", flush=True)
        prepare_text_corpus(text, folder, TEXT_VOCAB_SIZE, TEXT_SPECIAL_TOKENS)


def check_data(cfg):
    """The shards' headers, before anything is created: enough tokens for a batch (and eval_batches); ShardFacts."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    shards_from_text(cfg)
    paths = shard_paths(cfg["train_shards"])
    try:
        TokenShardLoader(paths, cfg["batch_size"], cfg["seq_len"], 0, world, hash_shards=False)  # a global batch fits
    except ShardError:
        raise
    except ValueError as e:
        raise ConfigError(f"seq_len={cfg['seq_len']} (x batch_size={cfg['batch_size']}): {e}; lower them, or "
                          "use larger shards") from None
    if cfg["eval_interval"]:
        val = shard_paths(cfg["val_shards"])
        available = TokenShardLoader(val, cfg["batch_size"], cfg["seq_len"], 0, world,
                                     hash_shards=False).batches_per_epoch()
        if available < cfg["eval_batches"]:
            raise ConfigError(f"val_shards {cfg['val_shards']} hold {available} batches of {world}x{cfg['batch_size']}x"
                              f"{cfg['seq_len']} tokens, eval_batches={cfg['eval_batches']}: lower eval_batches, or "
                              "eval_interval=0 to train without evaluation")
        paths = paths + val
    return shard_facts(paths)


def check_tokenizer(cfg, tokenizer, arch, shards):
    """The tokenizer shipped in checkpoints against the model and the shards."""
    n = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1
    if n > arch.vocab_size:
        raise ConfigError(f"tokenizer={cfg['tokenizer'] or cfg['init_from']!r} has {n} ids, more than vocab_size="
                          f"{arch.vocab_size}: set --vocab_size to at least {n}, or ship the tokenizer the shards "
                          "were written with")
    if shards.vocab_size is not None and shards.vocab_size != n:
        raise ConfigError(f"tokenizer={cfg['tokenizer'] or cfg['init_from']!r} has {n} ids, but the shards were "
                          f"written with a tokenizer of {shards.vocab_size}: ship the tokenizer that wrote them")


def check_ids(cfg, arch, shards=None):
    """Special token ids against the vocabulary (and against the shards, when their headers say)."""
    V = arch.vocab_size
    for key in ("bos_id", "eos_id", "pad_id", "mask_id"):
        value = getattr(arch, key)
        if value is not None and not 0 <= value < V:
            raise ConfigError(f"{key}={value} is outside the vocabulary (vocab_size={V}): set --{key} to the "
                              f"tokenizer's id for it, or -1 for none")
    if cfg["objective"] == "mlm" and cfg["clm_fraction"] < 1:
        if arch.mask_id is None:
            raise ConfigError("objective='mlm' needs a mask token id: set --mask_id (e.g. 50257, an unused id of "
                              "the padded GPT-2 vocabulary, 103 = [MASK] of BERT's, or 128002 = <|mask|> of the "
                              "Llama-3/EuroBERT tokenizer)")
        if arch.mask_id in (arch.bos_id, arch.eos_id):
            raise ConfigError(f"mask_id={arch.mask_id} is also the document delimiter (bos_id/eos_id): the mask "
                              "token must be an id the text never contains")
    if shards is None:
        return
    where = f"the shards {cfg['train_shards']}"
    if shards.max_token_id is not None and shards.max_token_id >= V:
        raise ConfigError(f"{where} hold token id {shards.max_token_id}, but vocab_size={V}: they were written "
                          f"with another tokenizer; set --vocab_size to at least {shards.max_token_id + 1} (a "
                          "multiple of 128 is fastest), or prepare the shards with this model's tokenizer")
    if shards.vocab_size is not None and shards.vocab_size > V:
        raise ConfigError(f"{where} were written with a tokenizer of {shards.vocab_size} ids, but vocab_size={V}: "
                          f"set --vocab_size to at least {shards.vocab_size}")
    delimiter = shards.delimiter_id
    if delimiter is not None and delimiter not in (arch.bos_id, arch.eos_id):
        raise ConfigError(f"{where} start every document with token {delimiter}, but eos_id={arch.eos_id} and "
                          f"bos_id={arch.bos_id}: set --eos_id={delimiter} (decoders) or --bos_id={delimiter} "
                          "(the delimiter is never masked and separates documents)")
