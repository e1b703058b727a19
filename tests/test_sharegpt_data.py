"""`recipes/pools/sharegpt_data.py`: the rules on a tiny in-memory file (no package, no network) with a character
tokenizer in the default target's chat template, and the store it writes as `train_feature_head.py` consumes it."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_llama
from test_recipes import recipe

SMOLLM2_TEMPLATE = (  # SmolLM2-135M-Instruct's chat template
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def sharegpt():
    return recipe("pools.sharegpt_data")


@pytest.fixture(scope="module")
def tokenizer():
    """One token per character (printable ASCII and newline) plus the chat template's special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    chars = {c: i for i, c in enumerate(["\0", "\n", *map(chr, range(32, 127))])}
    backend = Tokenizer(WordLevel(chars, unk_token="\0"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="\0")
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = SMOLLM2_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def bench(sharegpt):
    return sharegpt.BenchmarkFilter(sharegpt.benchmark_prompts())


def turn(role: str, text: str) -> dict:
    return {"from": role, "value": text}


ANSWER = "The tides follow the Moon, and the Earth turns under the two bulges of water that it raises."


def sample(sharegpt) -> str:
    """A cut-off JSON array like the package's: one conversation of each kind, the last record cut mid-way."""
    from hf_metasd.benchmark.prompts import load_bench_prompts

    restated = load_bench_prompts(["mt_bench"], per_task=1)[0].text
    records = [
        {"id": "keep_0", "conversations": [turn("human", "Why are there two tides a day? 2 / 2"), turn("gpt", ANSWER),
                                           turn("human", "And what is a spring tide?")]},  # last question unanswered
        {"id": "bench_0", "conversations": [turn("human", f"Please, {restated.upper()}"), turn("gpt", ANSWER)]},
        {"id": "empty_0", "conversations": [turn("human", "What is the time?"), turn("gpt", "  ")]},
        {"id": "twice_0", "conversations": [turn("human", "Hello there, it is me."), turn("human", "Are you there?")]},
        {"id": "split_0", "conversations": [turn("human", "Tell me of the sea."), turn("gpt", "It is the salt water.")]},
        {"id": "split_1", "conversations": [turn("gpt", "It is the salt water."), turn("human", "And of the rain?"),
                                            turn("gpt", "It is the water that falls from the clouds to the land.")]},
        {"id": "orphan_2", "conversations": [turn("human", "What about it?"), turn("gpt", "That is for you.")]},
        {"id": "spanish_0", "conversations": [turn("human", "Que es una marea y por que hay dos?"),
                                              turn("gpt", "Es el movimiento del mar que se produce por la luna, pero "
                                                          "hay dos porque la Tierra gira, como una pelota.")]},
        {"id": "remnant_0", "conversations": [turn("human", "Fix this"), turn("gpt", "python\nCopy code\nx = 1")]},
    ]  # fmt: skip
    text = json.dumps(records, indent=1)
    return text[:-2] + ',\n {"id": "cut_0", "conversations": [{"from": "human", "value": "Hello th'


def test_the_rules_keep_whole_answered_english_conversations_with_every_assistant_turn_marked(
    sharegpt, tokenizer, bench
):
    store, counts, totals = sharegpt.build(sample(sharegpt), tokenizer, bench, max_tokens=1024, max_conversations=None)
    assert store["ids"] == ["keep", "split"]
    assert {k: v for k, v in counts.items() if v} == {
        "read": 9, "kept": 2, "restates_benchmark": 1, "empty_turn": 1, "not_alternating": 1, "parts_broken": 1,
        "not_english": 1, "page_remnant": 1, "cut_by_file_end": 1,
    }  # fmt: skip
    keep = store["prompts"][0] + store["outputs"][0]
    text = tokenizer.decode(keep)
    assert text.endswith(f"<|im_start|>assistant\n{ANSWER}<|im_end|>")  # the unanswered question is cut off
    assert "Why are there two tides a day?<|im_end|>" in text  # the page's edit counter ("2 / 2") is removed
    assert store["answer_spans"][0] == [[len(store["prompts"][0]), len(keep)]]
    assert tokenizer.decode(store["outputs"][0]) == f"{ANSWER}<|im_end|>"
    # the split conversation is joined (the repeated turn once), and both assistant turns are scored
    split = store["prompts"][1] + store["outputs"][1]
    assert [tokenizer.decode(split[a:b]) for a, b in store["answer_spans"][1]] == [
        "It is the salt water.<|im_end|>", "It is the water that falls from the clouds to the land.<|im_end|>",
    ]  # fmt: skip
    assert tokenizer.decode(split).count("It is the salt water.") == 1
    assert totals["assistant_tokens"] == sum(b - a for spans in store["answer_spans"] for a, b in spans)


def test_a_cut_inside_a_user_turn_moves_back_to_the_last_answer_and_no_answer_in_reach_drops(sharegpt, tokenizer):
    messages = [
        {"role": "user", "content": "Tell me of the sea."},
        {"role": "assistant", "content": "It is the salt water."},
        {"role": "user", "content": "And of the rain?"},
        {"role": "assistant", "content": "It falls."},
    ]
    ids, spans, cut = sharegpt.encode(tokenizer, messages, 10_000)
    assert not cut and tokenizer.decode(ids[spans[-1][0] :]) == "It falls.<|im_end|>"
    first_end = spans[0][1]
    inside_user = sharegpt.encode(tokenizer, messages, first_end + 5)
    assert inside_user[0] == ids[:first_end] and inside_user[1] == [spans[0]] and inside_user[2]
    inside_answer = sharegpt.encode(tokenizer, messages, spans[1][0] + 3)
    assert inside_answer[1] == [spans[0], [spans[1][0], spans[1][0] + 3]] and inside_answer[2]
    assert sharegpt.encode(tokenizer, messages, spans[0][0]) is None


def test_a_benchmark_prompt_is_found_through_case_punctuation_and_spacing(sharegpt):
    text = "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences."
    rules = sharegpt.BenchmarkFilter([text, "Who wrote it?"], ngram=13, min_words=8)
    assert rules.unchecked == 1
    restated = "hi! COMPOSE an engaging travel-blog post about a recent trip to Hawaii , highlighting  cultural x"
    assert rules.restates([{"role": "user", "content": restated}])
    assert not rules.restates([{"role": "assistant", "content": restated}])  # user turns only
    assert not rules.restates([{"role": "user", "content": "a recent trip to Hawaii, highlighting cultural sites"}])
    short = sharegpt.BenchmarkFilter(["who sang i ran all the way home"], ngram=13, min_words=8)
    assert short.restates([{"role": "user", "content": "Q: Who sang 'I ran all the way home'?"}])


def test_the_store_is_what_train_feature_head_reads_and_it_scores_every_assistant_span(sharegpt, tokenizer, tmp_path):
    train = recipe("pools.train_feature_head")
    data = tmp_path / "sample.json"
    data.write_text(sample(sharegpt))
    out = tmp_path / "stores"
    provenance = sharegpt.main(["--data-file", str(data), "--out", str(out)], tokenizer=tokenizer)
    assert provenance["counts"]["kept"] == 2 and provenance["counts"]["restates_benchmark"] == 1
    assert json.loads((out / "provenance.json").read_text())["source"]["sha256"] == provenance["source"]["sha256"]
    torch.save({"prompts": [[5, 6, 7]], "outputs": [[8, 9]]}, out / "plain.pt")  # a store without spans
    split = train.read_stores(out, ["sharegpt", "plain"], None, 0)["train"]
    assert [row.spans is None for row in split] == [False, False, True]
    train.write_features(tiny_llama(0, vocab=128), split, (1, 2), tmp_path, "train", 8, torch.float32, "test")
    chunk = train.read_chunk(tmp_path / "train-00000.safetensors")
    for row, cached in zip(split, chunk, strict=True):
        task, prompt, answer = row
        expected = torch.zeros(len(prompt) + len(answer), dtype=torch.bool)
        if row.spans is None:  # as before: every position from the last prompt token on
            expected[len(prompt) - 1 :] = True
        for start, end in row.spans or []:  # the positions that predict each assistant token
            expected[start - 1 : end - 1] = True
        assert torch.equal(cached["scored"], expected), task
    batch = next(train.batches(tmp_path, "train", 3, None))  # the training loss scores the batch's scored positions
    _, mask = train.step_targets(batch, 1, batch["input_ids"].shape[1] - 2)
    assert torch.equal(mask, batch["scored"][:, 2:])
    first = split[1].spans[0][0]  # the joined conversation: nothing before its first answer, then that answer
    assert not batch["scored"][1, : first - 1].any() and batch["scored"][1, first - 1 : split[1].spans[0][1] - 1].all()
