"""The SimReg paper's evaluation tools: eval/compare_runs.py (steps/tokens to a target val_loss,
speed-up, curves) on synthetic train_lm.py logs with known crossing points, and eval/zeroshot.py
(lm-evaluation-harness style log-likelihood multiple choice) against hand-computed log-probs, on
Hub-layout parquet files served by the fake Hub, and on the real tiny LLaMA stories260K."""
import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import model as M
from hf.models import from_pretrained, save_pretrained
from eval import compare_runs as C
from eval import zeroshot as Z
from fakehub import fake_hub  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

# ================================================================ compare_runs

BASE_VALS = {200: 4.0, 400: 3.6, 600: 3.4, 800: 3.3, 1000: 3.2}
SIMREG_VALS = {200: 3.9, 400: 3.5, 600: 3.25, 800: 3.15, 1000: 3.1}   # crosses 3.2 halfway 600 -> 800


def write_run(folder, vals, tokens_per_step=4096, angle=61.3, simreg=False, last_step=1000):
    """A log.jsonl shaped like train_lm.py's: train records every 10 steps, evals at `vals`' steps."""
    folder.mkdir(parents=True)
    with open(folder / "log.jsonl", "w") as f:
        for step in range(10, last_step + 1, 10):
            ce = 6.0 - step / 500
            rec = dict(step=step, loss=ce + (0.25 if simreg else 0.0), ce=ce, lr=1e-3, tokens=step * tokens_per_step)
            if simreg:
                rec["simreg"] = 2.5
            f.write(json.dumps(rec) + "\n")
            if step in vals:
                f.write(json.dumps(dict(step=step, val_loss=vals[step], interclass_angle=angle + step / 1000,
                                        angle_classes=40)) + "\n")
    return folder


@pytest.fixture
def runs(tmp_path):
    base = write_run(tmp_path / "llama_baseline", BASE_VALS)
    simreg = write_run(tmp_path / "llama_simreg", SIMREG_VALS, angle=74.0, simreg=True)
    return base, simreg


def test_speedup_at_baseline_final_loss(runs):
    """Default target = the baseline's final val_loss (3.2); SimReg crosses it at step 700 -> 30 % fewer steps."""
    res = C.compare([C.load_run(p) for p in runs])
    base, simreg = res["runs"]
    assert res["target"] == 3.2 and "baseline" in res["target_source"]
    assert (base["steps_to_target"], base["interpolated"]) == (1000, False), "baseline reaches its final loss at 1000"
    assert simreg["steps_to_target"] == pytest.approx(700.0), "linear crossing between (600, 3.25) and (800, 3.15)"
    assert simreg["interpolated"] and simreg["bracket"] == [600, 800]
    assert simreg["fewer_steps_pct"] == pytest.approx(30.0)
    assert simreg["tokens_to_target"] == pytest.approx(700 * 4096)
    assert "llama_simreg reaches the baseline's final loss with 30.0 % fewer steps" in C.format_table(res)


def test_interpolation_with_explicit_target(runs):
    """--target 3.5: the baseline crosses between evals (500, interpolated); SimReg hits 3.5 exactly at 400."""
    base, simreg = C.compare([C.load_run(p) for p in runs], target=3.5)["runs"]
    assert base["steps_to_target"] == pytest.approx(500.0) and base["interpolated"]
    assert simreg["steps_to_target"] == 400 and simreg["interpolated"] is False and simreg["bracket"] == [200, 400]
    assert simreg["fewer_steps_pct"] == pytest.approx(20.0)


def test_first_evaluation_already_below_target():
    """No earlier eval to interpolate from: the first eval's step is reported, with an open bracket."""
    evals = [dict(step=200, val_loss=3.0), dict(step=400, val_loss=2.9)]
    assert C.first_reach(evals, 3.2) == (200, False, (None, 200))


def test_tokens_speedup_uses_each_runs_own_tokens(tmp_path):
    """Half the tokens per step: 700 steps x 2048 tokens vs 1000 x 4096 = 65 % fewer tokens, still 30 % fewer steps."""
    base = write_run(tmp_path / "base", BASE_VALS, tokens_per_step=4096)
    small = write_run(tmp_path / "small_batch", SIMREG_VALS, tokens_per_step=2048)
    r = C.compare([C.load_run(base), C.load_run(small)])["runs"][1]
    assert r["tokens_to_target"] == pytest.approx(700 * 2048)
    assert (r["fewer_steps_pct"], r["fewer_tokens_pct"]) == (pytest.approx(30.0), pytest.approx(65.0))


def test_run_that_never_reaches_target_is_reported(runs, tmp_path, capsys):
    """A run whose val_loss stays above the target: 'not reached', no speed-up, and no crash."""
    stuck = write_run(tmp_path / "stuck", {200: 4.2, 600: 3.7, 1000: 3.45})
    assert C.main([str(runs[0]), str(runs[1]), str(stuck)]) == 0
    out = capsys.readouterr().out
    assert "not reached" in out and "stuck does not reach the baseline's final loss" in out
    r = C.compare([C.load_run(p) for p in (*runs, stuck)])["runs"][2]
    assert (r["reached"], r["steps_to_target"], r["fewer_steps_pct"]) == (False, None, None)
    assert r["best_val_loss"] == 3.45


def test_baseline_that_never_reaches_explicit_target(runs, capsys):
    C.main([str(runs[0]), str(runs[1]), "--target", "3.12"])
    out = capsys.readouterr().out
    assert "baseline llama_baseline never reaches" in out, out


def test_final_losses_use_ce_and_last_angle(runs):
    """Train loss is the logged CE (a SimReg run's `loss` includes lambda*R); the angle is the last eval's."""
    r = C.compare([C.load_run(p) for p in runs])["runs"][1]
    assert r["final_train_ce"] == pytest.approx(6.0 - 1000 / 500), "must be `ce`, not `loss` (= ce + 0.25)"
    assert r["final_val_loss"] == 3.1 and r["final_step"] == 1000
    assert r["interclass_angle"] == pytest.approx(75.0) and r["angle_step"] == 1000


def test_missing_log_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        C.load_run(tmp_path / "nope")


def test_cli_as_script_and_as_module(runs, tmp_path):
    """`python eval/compare_runs.py` from another folder and `python -m eval.compare_runs --json`."""
    script = subprocess.run([sys.executable, str(ROOT / "eval" / "compare_runs.py"), *map(str, runs)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert script.returncode == 0, script.stderr
    assert "target val_loss 3.2000" in script.stdout
    module = subprocess.run([sys.executable, "-m", "eval.compare_runs", *map(str, runs), "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert module.returncode == 0, module.stderr
    assert json.loads(module.stdout)["runs"][1]["fewer_steps_pct"] == pytest.approx(30.0)


def test_plot_skipped_cleanly_without_matplotlib(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    png = tmp_path / "curves.png"
    assert C.main([*map(str, runs), "--plot", str(png), "--json", str(tmp_path / "r.json")]) == 0
    out, err = capsys.readouterr()
    assert "pip install matplotlib" in err, err
    assert not png.exists() and "fewer steps" in out and (tmp_path / "r.json").exists()


def test_plot_written_with_matplotlib(runs, tmp_path):
    pytest.importorskip("matplotlib")
    png = C.plot_curves([C.load_run(p) for p in runs], tmp_path / "curves.png", target=3.2)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ================================================================ zeroshot: scoring


class ByteTokenizer:
    """Token = UTF-8 byte; 256 starts a sequence."""
    start_id, name = 256, "bytes"

    def encode(self, text):
        return list(text.encode("utf-8"))


def tiny_llama(vocab=260, max_seq_len=64):
    torch.manual_seed(0)
    cfg = M.ModelConfig(**{**M.FAMILY_TRAITS["llama"], "family": "llama", "vocab_size": vocab, "d_model": 32,
                           "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64, "max_seq_len": max_seq_len,
                           "bos_id": 256, "eos_id": 256})
    model = M.Transformer(cfg).eval()
    with torch.no_grad():  # sharper predictions than the 0.02-std init, so scores differ visibly
        model.head.decoder.weight.mul_(20)
    return model


def direct_ll(model, ctx, cont):
    """sum_j log p(cont_j | ctx, cont_<j) from one plain forward pass, no batching, no mask."""
    with torch.no_grad():
        logp = model(torch.tensor([ctx + cont]))[0].double().log_softmax(-1)
    return sum(float(logp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont))


def test_score_equals_hand_computed_log_probs():
    model, tok = tiny_llama(), ByteTokenizer()
    ctx, cont = Z.encode_pair(tok, "The cat sat on the", " mat.")
    assert cont == list(b" mat.")
    got = Z.score_requests(model, [([256] + ctx, cont)], progress=False)[0]
    assert got == pytest.approx(direct_ll(model, [256] + ctx, cont), abs=1e-4)


def test_trailing_context_space_moves_to_continuation():
    """The harness's boundary rule: 'Answer: ' + 'x' scores ' x' after 'Answer:'."""
    ctx, cont = Z.encode_pair(ByteTokenizer(), "Answer: ", " yes")
    assert (bytes(ctx), bytes(cont)) == (b"Answer:", b"  yes")


def test_batched_padded_scores_equal_one_by_one():
    model, tok = tiny_llama(), ByteTokenizer()
    g = torch.Generator().manual_seed(1)
    reqs = [([256] + torch.randint(0, 256, (int(n),), generator=g).tolist(),
             torch.randint(0, 256, (int(m),), generator=g).tolist())
            for n, m in zip(torch.randint(1, 30, (11,), generator=g), torch.randint(1, 9, (11,), generator=g))]
    one = [Z.score_requests(model, [r], batch_size=1, progress=False)[0] for r in reqs]
    batched = Z.score_requests(model, reqs, batch_size=4, progress=False)
    assert batched == pytest.approx(one, abs=1e-4), "padding or reordering changed a score"
    assert one[0] == pytest.approx(direct_ll(model, *reqs[0]), abs=1e-4)


def test_long_sequences_keep_their_last_tokens():
    model = tiny_llama(max_seq_len=16)
    ctx, cont = [256] + list(range(30)), [40, 41, 42]
    full = (ctx + cont)[-17:]
    got = Z.score_requests(model, [(ctx, cont)], progress=False)[0]
    assert got == pytest.approx(direct_ll(model, full[:-3], full[-3:]), abs=1e-4)


def test_tokenizer_of_another_model_is_refused():
    with pytest.raises(ValueError, match="vocab_size 260"):
        Z.score_requests(tiny_llama(), [([256, 1], [50256])], progress=False)


def test_acc_and_acc_norm_differ_when_lengths_differ():
    """Sum favours the short option; per-character average favours the long one (label 1)."""
    items = [Z.Item(["Q"] * 2, ["a", "a much longer answer"], 1)]
    m = Z.accuracy(items, [-3.0, -5.0])
    assert (m["acc"], m["acc_norm"], m["acc_bytes"]) == (0.0, 1.0, 1.0)
    # characters vs UTF-8 bytes: "é" is 1 character but 2 bytes
    m = Z.accuracy([Z.Item(["Q"] * 2, ["éé", "abc"], 0)], [-2.1, -3.0])
    assert (m["acc_norm"], m["acc_bytes"]) == (0.0, 1.0), "-2.1/2 < -3/3 per char but -2.1/4 > -3/3 per byte"


def test_winogrande_scores_the_suffix_after_each_filled_blank():
    row = dict(sentence="The trophy did not fit in the case because _ was too big.",
               option1="the trophy", option2="the case", answer="1")
    item = Z.winogrande_item(row)
    assert item.contexts == ["The trophy did not fit in the case because the trophy",
                             "The trophy did not fit in the case because the case"]
    assert item.choices == ["was too big."] * 2 and item.label == 0
    model, tok = tiny_llama(vocab=300, max_seq_len=128), ByteTokenizer()
    (c1, t1), (c2, t2) = Z.item_requests(tok, [item])
    assert t1 == t2 == list(b" was too big."), "both options must score the same suffix"
    _, lls = Z.evaluate_items(model, tok, [item], progress=False)
    assert lls == pytest.approx([direct_ll(model, c1, t1), direct_ll(model, c2, t2)], abs=1e-4)
    assert Z.winogrande_item({**row, "answer": "2"}).label == 1


# ================================================================ zeroshot: data


def parquet_bytes(rows):
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


HUB_ROWS = {  # one row per benchmark in its Hub column layout (extra columns included)
    "hellaswag": [dict(ind=4, activity_label="Removing ice from car", ctx_a="Then, the man writes over the snow.",
                       ctx_b="then", ctx="Then, the man writes over the snow. then", source_id="x", split="val",
                       split_type="indomain", label="3",
                       endings=[", the man eats.", ", the man sings.", "[header] Stop [title] Now.", ", he smiles."])],
    "piqa": [dict(goal="Keep soup warm", sol1="Put it in the fridge.", sol2="Cover the pot.", label=1)],
    "arc_easy": [dict(id="Q1", question="Which is a gas?", answerKey="C",
                      choices=dict(text=["ice", "water", "steam"], label=["A", "B", "C"]))],
    "arc_challenge": [dict(id="Q2", question="2+2?", answerKey="1",
                           choices=dict(text=["4", "5", "6", "7"], label=["1", "2", "3", "4"]))],
    "winogrande": [dict(sentence="Ann gave Sue a gift because _ was kind.", option1="Ann", option2="Sue", answer="2")],
}


def test_hub_parquet_loaders_through_fake_hub(fake_hub):
    commits = {name: fake_hub.add_file(Z.TASKS[name].repo, Z.TASKS[name].file, parquet_bytes(rows),
                                       repo_type="dataset") for name, rows in HUB_ROWS.items()}
    loaded = {name: Z.load_task(name) for name in HUB_ROWS}
    (hs,), src = loaded["hellaswag"]
    assert src == f"Rowan/hellaswag@{commits['hellaswag']}:data/validation-00000-of-00001.parquet"
    assert hs.contexts[0] == "Removing ice from car: Then, the man writes over the snow. Then"
    assert hs.choices[2] == " Stop. Now." and hs.label == 3, "WikiHow [title]/[header] clean-up"
    (pi,), _ = loaded["piqa"]
    assert pi.contexts == ["Question: Keep soup warm\nAnswer:"] * 2 and pi.label == 1
    assert loaded["arc_easy"][0][0].label == 2 and loaded["arc_easy"][0][0].choices == ["ice", "water", "steam"]
    assert loaded["arc_challenge"][0][0].label == 0
    (wg,), _ = loaded["winogrande"]
    assert wg.contexts == ["Ann gave Sue a gift because Ann", "Ann gave Sue a gift because Sue"] and wg.label == 1


def test_hub_file_found_by_pattern_when_moved(fake_hub):
    commit = fake_hub.add_file("baber/piqa", "data/validation-00000-of-00001.parquet",
                               parquet_bytes(HUB_ROWS["piqa"]), repo_type="dataset")
    items, src = Z.load_task("piqa")
    assert len(items) == 1 and src == f"baber/piqa@{commit}:data/validation-00000-of-00001.parquet"


def test_hub_parquet_missing_column_is_named(fake_hub):
    fake_hub.add_file("baber/piqa", Z.TASKS["piqa"].file, parquet_bytes([dict(goal="g", sol1="a", label=0)]),
                      repo_type="dataset")
    with pytest.raises(ValueError, match=r"no column\(s\) \['sol2'\]"):
        Z.load_task("piqa")


def test_jsonl_items_and_errors(tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text(json.dumps(dict(context="c", choices=["x", "y"], label=1)) + "\n\n"
                    + json.dumps(dict(contexts=["a", "b"], continuation="z", label=0)) + "\n")
    items, _ = Z.load_task(str(good))
    assert [(i.contexts, i.choices, i.label) for i in items] == [(["c", "c"], ["x", "y"], 1), (["a", "b"], ["z", "z"], 0)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(dict(context="c", choices=["x"], label=0)) + "\n"
                   + json.dumps(dict(context="c", choices=["x", "y"], label=2)) + "\n")
    with pytest.raises(ValueError, match=rf"{bad}:2: 'label'"):
        Z.load_task(str(bad))


def test_a_bad_task_file_is_one_error_line_not_a_traceback(tmp_path, capsys):
    from cli import run_cli
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(dict(context="c", choices=["x", "y"], label=5)) + "\n")
    with pytest.raises(SystemExit) as e:
        run_cli(Z.load_task, str(bad))
    assert e.value.code == 2 and capsys.readouterr().err.startswith(f"error: {bad}:1: 'label'")


def byte_level_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.add_special_tokens(["<|endoftext|>"])  # id 256: the document boundary
    return tok


def harness_requests(tok, items):
    """lm-evaluation-harness 0.4.13 (add_bos_token unset): contexts encoded with the tokenizer's own
    template; an empty context gets BOS (else EOS) as its only token."""
    out = []
    for item in items:
        for context, choice in zip(item.contexts, item.choices):
            continuation = " " + choice
            if not context:
                out.append(([tok.start_id], tok.tok.encode(continuation, add_special_tokens=False).ids))
                continue
            n = len(context) - len(context.rstrip())
            context, continuation = context[:len(context) - n], context[len(context) - n:] + continuation
            whole, ctx = (tok.tok.encode(t).ids for t in (context + continuation, context))
            out.append((ctx, whole[len(ctx):]))
    return out


@pytest.mark.parametrize("template_adds_bos", [True, False])
def test_start_token_setting_that_matches_the_harness_follows_the_tokenizer_template(template_adds_bos, tmp_path):
    """The docstring's rule: a template that adds BOS -> the default matches the harness; a template
    that adds nothing -> --no-start-token does."""
    from tokenizers.processors import TemplateProcessing
    tok = byte_level_tokenizer()
    if template_adds_bos:
        tok.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 256)])
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = Z.HFTokenizer(tmp_path)
    items = [Z.Item(["Question: why?\nAnswer: ", ""], ["because", "never"], 0)]
    harness = harness_requests(hf, items)
    assert Z.item_requests(hf, items, add_start=template_adds_bos) == harness
    assert Z.item_requests(hf, items, add_start=not template_adds_bos) != harness


def test_cli_end_to_end_on_a_saved_checkpoint(tmp_path, capsys):
    folder = save_pretrained(tiny_llama(vocab=257), tmp_path / "model", tokenizer=byte_level_tokenizer())
    items = tmp_path / "story.jsonl"
    items.write_text("".join(json.dumps(dict(context=f"Item {i}:", choices=["yes", "no", "maybe"], label=i % 3)) + "\n"
                             for i in range(7)))
    out = tmp_path / "res" / "results.json"
    Z.main(["--model", str(folder), "--tasks", str(items), "--out", str(out), "--batch-size", "5", "--device", "cpu"])
    res = json.loads(out.read_text())
    task = res["tasks"]["story"]
    tok = Z.HFTokenizer(folder)
    assert tok.start_id == 256 and len(tok.encode("ab")) == 2, "encode must not add special tokens itself"
    expect, _ = Z.evaluate_items(from_pretrained(folder), tok, Z.read_jsonl_items(items), progress=False)
    assert task["n"] == 7 and task["acc"] == expect["acc"] and res["mean"]["acc"] == expect["acc"]
    assert "story" in capsys.readouterr().out


def test_script_runs_from_another_folder(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "eval" / "zeroshot.py"), "--help"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--tokenizer" in r.stdout, r.stderr


# ================================================================ the real tiny LLaMA


class Llama2cTokenizer:
    """llama2.c's tok512.bin: int32 max_token_length, then per token (float32 score, int32 length, bytes).

    Encoding as llama2.c's run.c: a leading space (SentencePiece's dummy prefix), one token per
    character (UTF-8 bytes -> <0xXX> tokens 3..258 when missing), then repeatedly merge the
    adjacent pair whose concatenation is the highest-scoring vocabulary entry."""
    start_id, name = 1, "llama2.c tok512"

    def __init__(self, path):
        data, off = Path(path).read_bytes(), 4
        self.pieces, self.scores = [], []
        while off < len(data):
            score, n = struct.unpack_from("<fi", data, off)
            self.pieces.append(data[off + 8: off + 8 + n].decode("utf-8", "replace"))
            self.scores.append(score)
            off += 8 + n
        self.index = {p: i for i, p in enumerate(self.pieces)}

    def encode(self, text):
        if not text:
            return []
        ids = []
        for ch in " " + text:
            ids += [self.index[ch]] if ch in self.index else [b + 3 for b in ch.encode("utf-8")]
        while True:
            best = None
            for i in range(len(ids) - 1):
                j = self.index.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if j is not None and (best is None or self.scores[j] > best[0]):
                    best = (self.scores[j], i, j)
            if best is None:
                return ids
            ids[best[1]:best[1] + 2] = [best[2]]


STORY_ITEMS = [  # hand-written; the sensible ending is `label`, the other is grammatical nonsense
    ("Once upon a time, there was a little girl named Lily. She loved to play outside in the",
     ["park.", "spoon."], 0),
    ("Tom had a red ball. He liked to throw the ball to his", ["soup.", "dog."], 1),
    ("The sun was shining and the birds were", ["singing in the trees.", "eating the big car."], 0),
    ("Lily lost her toy and she was very sad. Her mom gave her a big", ["window.", "hug."], 1),
    ("It was a cold day, so Sue put on her warm", ["coat.", "banana."], 0),
    ("The cat was hungry, so it", ["flew to the moon.", "ate some fish."], 1),
    ("Ben and Mia played with the blocks. They built a tall", ["tower.", "sandwich."], 0),
    ("At night, Lily went to bed and closed her", ["spoon.", "eyes."], 1),
    ("Tim was thirsty after playing, so he drank a glass of", ["water.", "rocks."], 0),
    ("The little dog was happy and wagged its", ["book.", "tail."], 1),
]


def test_real_stories260k_prefers_sensible_endings(shared_data):
    """The real tiny LLaMA (TinyStories) picks the sensible ending more often than not."""
    folder = shared_data / "models" / "stories260K"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent (experiments/fetch_data.py does not fetch it)")
    model, tok = from_pretrained(folder), Llama2cTokenizer(folder / "tok512.bin")
    assert tok.encode("Once upon a time") and all(i < 512 for i in tok.encode("Once upon a time, é!"))
    items = [Z.Item([c] * len(ch), ch, y) for c, ch, y in STORY_ITEMS]
    m, lls = Z.evaluate_items(model, tok, items, batch_size=8, progress=False)
    print(f"\nstories260K on {m['n']} story items: acc {m['acc']:.2f}, acc_norm {m['acc_norm']:.2f}")
    assert m["acc"] > 0.5, f"sensible ending won only {m['acc']:.0%} (log-likelihoods {lls})"
