"""recipes/pools/train_feature_head.py's recipe options (issue 42, item 1): global shuffle, warm-up and cosine decay,
AdamW betas, the LM head from the target's rows (frozen or fine-tuned), a step budget, train-only stores; and its
metrics: full and conditional accuracy per step, their standard errors. Tiny config-built targets, no
network."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import greedy, prompts, sharpen, tiny_llama
from test_recipes import recipe

from hf_metasd.feature_head import load_feature_head


@pytest.fixture(scope="module")
def train():
    return recipe("pools.train_feature_head")


def _stores(folder, target, tasks=("code", "qa"), per_task=6, answer_tokens=12):
    for i, task in enumerate(tasks):
        store = {"prompts": [], "outputs": [], "seconds": 1.0, "dtype": "float32"}
        for prompt in prompts(per_task, seed=200 + i):
            with torch.no_grad():
                out = greedy(target, prompt, answer_tokens)
            store["prompts"].append(prompt[0].tolist())
            store["outputs"].append(out[0, prompt.shape[1] :].tolist())
        torch.save(store, folder / f"{task}.pt")


def test_conditional_accuracy_counts_a_step_only_after_every_earlier_step_was_right(train):
    # two sequences; entry c of step s is right where `hit` says, scored where `scored` says (sequence 1's entry 0 is
    # a prompt position: never scored, so it conditions nothing)
    hit = [
        torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]]),
        torch.tensor([[1, 0, 1, 1], [1, 1, 0, 1]]),
        torch.tensor([[0, 1, 1], [1, 1, 1]]),
    ]
    scored = [torch.ones_like(h) for h in hit]
    scored[0][1, 0] = 0
    outcome = [(h.bool(), m.bool()) for h, m in zip(hit, scored, strict=True)]
    counts = train.step_counts(outcome)
    assert counts.shape == (2, 3, 4)
    # sequence 0, step 1: entries 0, 1, 3 had step 0 right; of those, 0 and 3 are right at step 1
    # step 2: entries 0 and 3 had steps 0 and 1 right, entry 3 has no step 2 (rows shrink): only entry 0, wrong
    assert counts[0].tolist() == [[4, 5, 4, 5], [3, 4, 2, 3], [2, 3, 0, 1]]
    # sequence 1: entry 0 unscored at step 0, so it never counts conditionally; steps 1, 2 of entries 1, 2
    assert counts[1].tolist() == [[2, 4, 2, 4], [3, 4, 1, 2], [3, 3, 1, 1]]
    # the standard error of a ratio over sequences: equal per-sequence ratios have none
    assert train.ratio_se(torch.tensor([1, 2, 3]), torch.tensor([2, 4, 6])) == 0.0
    se = train.ratio_se(torch.tensor([1, 3]), torch.tensor([2, 4]))  # r = 2/3; residuals -1/3, 1/3
    assert se == pytest.approx(math.sqrt(2 * (1 / 9) * 2) / 6)


def test_learning_rate_warms_up_then_decays_on_a_cosine(train):
    factors = [train.lr_factor(s, 10, 3, "cosine") for s in range(10)]
    assert factors[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert factors[3] == 1.0 and all(a > b for a, b in zip(factors[3:], factors[4:]))
    assert factors[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 6 / 7)))
    assert [train.lr_factor(s, 10, 0, "constant") for s in (0, 9)] == [1.0, 1.0]


def test_the_new_options_run_end_to_end_and_save_a_head_that_drafts_as_trained(train, tmp_path):
    target = sharpen(tiny_llama(0, layers=4))
    stores = tmp_path / "stores"
    stores.mkdir()
    _stores(stores, target)
    common = ["--stores", str(stores), "--work-dir", str(tmp_path / "work"), "--layer-ids", "1", "2", "4"]
    common += ["--draft-vocab-size", "48", "--intermediate-size", "32", "--val-sequences", "2", "--threads", "1"]
    common += ["--chunk-sequences", "3", "--batch-size", "3", "--train-only-tasks", "qa"]
    common += ["--shuffle", "global", "--schedule", "cosine", "--warmup", "2", "--betas", "0.9", "0.95"]
    common += ["--lr", "1e-2", "--epochs", "2"]
    record = train.main([*common, "--lm-head", "target-frozen", "--out", str(tmp_path / "head")], target=target)
    # qa is trained on whole; code's first 2 sequences are the held-out ones
    assert record["features"]["val"]["tokens"] > 0
    split = train.read_stores(stores, ["code", "qa"], None, 2, ["qa"])
    assert [len(split["train"]), len(split["val"])] == [10, 2] and {t for t, _, _ in split["val"]} == {"code"}
    # a global epoch reads every training sequence once
    epoch = list(train.batches(tmp_path / "work", "train", 3, train.random.Random(0), shuffle="global"))
    assert sorted(int(n) for b in epoch for n in b["lengths"]) == sorted(len(p) + len(a) for _, p, a in split["train"])
    assert train.count_batches(tmp_path / "work", "train", 3, shuffle="global") == len(epoch) == 4
    last = record["epochs"][-1]
    for key in ("agreement_step0", "agreement_step2", "conditional_step1", "conditional_step2"):
        assert 0.0 <= last[key] <= 1.0, key
    assert last["se_agreement_step0"] >= 0.0
    assert last["val_loss"] < record["untrained"]["val_loss"]  # it learns
    assert len(last["per_sequence"]) == last["val_sequences"] == 2
    assert sum(row[1] for row in last["per_sequence"]) == last["val_positions"]
    # saved: the frozen LM head = the target's rows of the draft vocabulary
    head = load_feature_head(tmp_path / "head", target)
    rows = target.lm_head.weight[head.draft_to_target(torch.arange(48))]
    torch.testing.assert_close(head.lm_head.weight, rows)
    # a cache written when the recipe also stored the target's top-k (the removed KL loss) is reused as it is
    meta_path = tmp_path / "work" / "features.json"
    meta = train.json.loads(meta_path.read_text())
    meta["settings"]["target_top_k"] = 32
    meta_path.write_text(train.json.dumps(meta))
    # the LM head from the target's rows, fine-tuned: it moves
    tuned_argv = [*common, "--lm-head", "target", "--max-steps", "5", "--autocast", "bfloat16"]
    tuned_argv += ["--out", str(tmp_path / "tuned")]
    tuned = train.main(tuned_argv, target=target)
    assert tuned["features"] == record["features"]  # the same cache, reused
    assert [e["steps"] for e in tuned["epochs"]] == [4, 5]  # 4 batches an epoch, stopped after 5 steps
    moved = load_feature_head(tmp_path / "tuned", target)
    assert not torch.equal(moved.lm_head.weight, rows)
    assert moved.lm_head.weight.dtype == torch.float32  # autocast passes, float32 weights
    assert tuned["epochs"][-1]["val_loss"] < tuned["untrained"]["val_loss"]  # it learns under autocast too


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--warmup", "-1"], "`--warmup` must be >= 0, but is -1"),
        (["--max-steps", "0"], "`--max-steps` must be >= 1, but is 0"),
        (["--lora-task", "code"], "`--lora-task` must come with `--base-head DIR`"),
    ],
)
def test_refuses_bad_schedule_and_adapter_options_by_name(train, capsys, argv, message):
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    assert message in capsys.readouterr().err
