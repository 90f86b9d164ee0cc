"""The quick start: the three papers' methods end to end at toy scale on a CPU, and a short summary.

    python experiments/quickstart.py                 # `make quickstart` runs this (a few minutes)
    python experiments/quickstart.py --out out/qs --steps 100

The sample text (data/sample/) -> a 2 048-id BPE and shards; a 2-layer LLaMA with cross-entropy, then
with SimReg; a 2-layer encoder, 25 % CLM then MLM; SPLADE with the MLM head rescaled, from splade-tiny
when experiments/fetch_data.py has fetched it, else from the Hub (configs/splade_tiny.py), else skipped
in one line. A finished run is skipped, so running it again only prints the summary.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, not experiments/, on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import importlib.util
import shlex
import shutil

import cli
import train_lm
import train_splade
from checkpoint import read_log
from data import manifest
from data.atomic import write_json
from data.text_corpus import TEXT_SPECIAL_TOKENS, TEXT_VOCAB_SIZE, prepare_text_corpus
from eval.compare_runs import compare, load_run
from throughput import use_cpu_threads

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample" / "tinyshakespeare.txt"
SPLADE_DATA = "data/repro"  # where experiments/fetch_data.py puts splade-tiny and the collections


def lm_args(corpus, out, steps, **over):
    """A 2-layer LLaMA (d 128) on the sample's shards: configs/repro_simreg_lm.py at `steps` steps."""
    base = dict(train_shards=corpus["train_shards"], val_shards=corpus["val_shards"], tokenizer=corpus["tokenizer"],
                vocab_size=corpus["vocab_size"], eos_id=corpus["special_ids"]["<|endoftext|>"], d_model=128,
                n_heads=4, d_ff=340, max_steps=steps, warmup_steps=steps // 10, eval_interval=steps // 8,
                out_dir=str(out), seed=0)
    return [str(ROOT / "configs" / "repro_simreg_lm.py")] + [f"--{k}={v}" for k, v in {**base, **over}.items()]


def finished(out, steps):
    log = Path(out) / "log.jsonl"
    return log.exists() and any(r.get("step") == steps and "val_loss" in r for r in read_log(log))


def train(argv, out, steps, script=train_lm):
    """Run unless a run of these very arguments finished (its job.json key); else set aside and rerun, or resume."""
    key, marker = {"script": script.__name__, "argv": argv}, Path(out) / "job.json"
    if (manifest.read_json(marker) or {}).get("key") == key and finished(out, steps):
        return
    if manifest.read(out, marker.name) is not None:
        manifest.aside(out, marker.name)
    script.main(argv)
    write_json(marker, {"key": key, "files": {}})


def splade_run(out, steps):
    """(train_splade.py arguments, what it evaluates on), or (None, why it is skipped)."""
    model, ir = ROOT / SPLADE_DATA / "models" / "splade-tiny", ROOT / SPLADE_DATA / "ir"
    needed = [model / "model.safetensors", *(ir / name / "corpus.jsonl" for name in ("cranfield", "cacm", "cisi"))]
    absent = [path.parent.name for path in needed if not path.exists()]
    if not absent:
        from experiments.splade_protocol import write_pairs
        pairs = Path(out) / "pairs.tsv"
        pairs.parent.mkdir(parents=True, exist_ok=True)
        write_pairs([ir / "cacm", ir / "cisi"], pairs)   # from the collections each time: never a stale copy
        recipe = [str(ROOT / "configs" / "repro_splade_train.py"), f"--init={model}", f"--train_data={pairs}",
                  "--k=1", f"--max_steps={steps}", f"--eval_interval={steps}", f"--ckpt_interval={steps}",
                  f"--eval_benchmark={ir / 'cranfield'}", "--eval_max_len=128", f"--out_dir={out}"]
        return recipe, f"splade-tiny on Cranfield ({SPLADE_DATA}/, fetched)"
    lacking = f"{SPLADE_DATA}/ lacks {', '.join(absent)}" if len(absent) < len(needed) else None  # partly fetched
    from hf import hub
    try:  # a HEAD request: is the backbone of configs/splade_tiny.py reachable (or cached)?
        hub.hf_hub_download("jhu-clsp/ettin-encoder-17m", "config.json")
    except hub.HubError:
        return None, (f"SPLADE skipped ({lacking or 'no pretrained checkpoint'}, no Hub): python "
                      "experiments/fetch_data.py --out data/repro fetches " + ("them" if lacking else "one (35 MB)"))
    return ([str(ROOT / "configs" / "splade_tiny.py"), f"--out_dir={out}"],
            "Ettin-17M rescaled by k=16, 2 000 MS MARCO triplets, NanoNFCorpus (Hub)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/quickstart", help="output folder (default: out/quickstart)")
    ap.add_argument("--steps", type=int, default=200, help="training steps of each language model (default 200)")
    ap.add_argument("--splade-steps", type=int, default=40, help="SPLADE steps on the fetched data (default 40)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if not SAMPLE.exists():
        raise cli.MissingInput(f"{SAMPLE} is missing: it ships with the repository (git checkout -- data/sample)")

    if line := use_cpu_threads():  # once for every run: the load of the first would lower the second's
        print(line)
    print("== data: the sample text -> a byte-level BPE and token shards")
    corpus = prepare_text_corpus(SAMPLE, out / "corpus", TEXT_VOCAB_SIZE, special_tokens=TEXT_SPECIAL_TOKENS)
    steps = args.steps
    print("== SimReg: a 2-layer LLaMA, cross-entropy, then cross-entropy + SimReg")
    train(lm_args(corpus, out / "lm", steps), out / "lm", steps)
    train(lm_args(corpus, out / "lm_simreg", steps, simreg=True, simreg_chunk=32), out / "lm_simreg", steps)
    print("== MLM vs CLM: an encoder, 25 % causal LM then masked LM")
    encoder = dict(family="eurobert", objective="mlm", clm_fraction=0.25, mask_id=corpus["special_ids"]["<|mask|>"],
                   schedule="wsd", decay_fraction=0.1)
    train(lm_args(corpus, out / "encoder", steps, **encoder), out / "encoder", steps)
    print("== SPLADE: the MLM head of a pretrained encoder as sparse lexical vectors")
    recipe, what = splade_run(out / "splade", args.splade_steps)
    splade_steps = args.splade_steps if what.startswith("splade-tiny") else 100
    if recipe is not None:
        train(recipe, out / "splade", splade_steps, script=train_splade)
    print(summary(out, corpus, recipe, what))


def data_line(corpus):
    return (f"data: {SAMPLE.relative_to(ROOT)}, {corpus['tokens']['train']:,} training tokens, a {corpus['vocab_size']}-id "
            "BPE")


def summary(out, corpus, recipe, what):
    lines = ["", "== summary", data_line(corpus)]
    result = compare([load_run(out / "lm", "CE"), load_run(out / "lm_simreg", "CE+SimReg")])
    base, sr = result["runs"]
    lines.append(f"LM loss (validation): CE {base['final_val_loss']:.3f} -> CE+SimReg {sr['final_val_loss']:.3f} "
                 f"after {base['final_step']} steps")
    if sr["reached"]:
        lines.append(f"SimReg reaches the CE run's final loss at step {sr['steps_to_target']:.0f} of "
                     f"{base['final_step']} ({sr['fewer_steps_pct']:.0f} % fewer steps; the paper: > 30 %)")
    else:
        lines.append("SimReg does not reach the CE run's final loss in these steps")
    lines.append(f"inter-class angle: CE {base['interclass_angle']:.1f} deg -> CE+SimReg {sr['interclass_angle']:.1f} deg "
                 "(the paper: ~61 -> ~74 deg at scale)")
    evals = [r for r in read_log(out / "encoder" / "log.jsonl") if "val_loss" in r]
    lines.append(f"encoder CLM -> MLM: masked-LM validation loss {evals[-1]['val_loss']:.3f} at step {evals[-1]['step']}")
    if recipe is None:
        lines.append(what)
    else:
        last = [r for r in read_log(out / "splade" / "log.jsonl") if "eval_nDCG@10" in r][-1]
        flops = next(v for k, v in last.items() if k.lower() == "eval_flops")
        lines.append(f"SPLADE ({what}): nDCG@10 {last['eval_nDCG@10']:.3f}, FLOPS {flops:.1f} at step {last['step']}")
    lines.append(files_line(out))
    return "\n".join(lines)


def files_line(out):
    """Where the runs are, and the command that plots them (with how to get matplotlib where it is missing)."""
    python = python_command()
    # from the repository (`make -C path quickstart` leaves the shell elsewhere), the PNG beside the runs
    plot = f"cd {shlex.quote(str(ROOT))} && {python} eval/compare_runs.py {out}/lm {out}/lm_simreg --plot {out}/curves.png"
    if importlib.util.find_spec("matplotlib") is None:
        plot = f"{python} -m pip install matplotlib, then {plot}"
    return f"(logs and checkpoints under {out}; plots: {plot})"


def python_command():
    """How to call this interpreter from the shell: `python` when that is the one on PATH (an active
    virtualenv), else its path (.venv/bin/python, as `make` runs it)."""
    on_path = shutil.which("python")
    if on_path and Path(on_path).resolve() == Path(sys.executable).resolve():
        return "python"
    try:
        return str(Path(sys.executable).relative_to(Path.cwd()))
    except ValueError:
        return sys.executable


if __name__ == "__main__":
    cli.run_cli(main)
