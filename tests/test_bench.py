"""The benchmark machinery on tiny models: every method runs, outputs are checked, the report is written."""

from __future__ import annotations

import json

import pytest
from conftest import prompts as random_prompts

from hf_metasd.benchmark.methods import build_methods
from hf_metasd.benchmark.prompts import BenchPrompt
from hf_metasd.benchmark.report import summarize, write_report
from hf_metasd.benchmark.run import BenchRecord, run_bench
from hf_metasd.drafters import ModelDrafter

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def bench_setup(target, drafters, target_copy):
    pool = [ModelDrafter(target_copy, name="qa"), ModelDrafter(drafters[0], name="rag")]
    ids = random_prompts(4, seed=7)
    prompts = [BenchPrompt(task, f"{task}/{i}", str(i)) for i, task in enumerate(["qa", "rag", "qa", "rag"])]
    encode = lambda tokenizer, text: ids[int(text)]  # noqa: E731
    return pool, prompts, encode


def test_methods_cover_the_baselines(bench_setup):
    pool, _, _ = bench_setup
    names = [m.name for m in build_methods(pool, stream_policy=True, transformers_baselines="all")]
    assert names[0] == "autoregressive"
    assert names[1] == "metasd"  # the pool's own defaults: what a user gets
    assert {"hf-assisted[qa]", "hf-assisted[rag]", "fixed[qa]", "fixed[rag]", "ucb-bd", "ucb-be"} <= set(names)
    assert {"hf-assisted[qa] (hf defaults)", "ucb-speed", "ucb_v-speed"} <= set(names)
    assert {"exp3", "successive_halving", "thompson", "random", "metasd (stream)"} <= set(names)


def test_run_and_report(bench_setup, target, tmp_path):
    pool, prompts, encode = bench_setup
    methods = build_methods(pool, num_assistant_tokens=3, transformers_baselines="all")
    records = run_bench(target, None, prompts, methods, max_new_tokens=10, progress=False, encode=encode)
    assert len(records) == len(prompts) * len(methods)
    assert all(r.identical for r in records), [(r.method, r.prompt_id) for r in records if not r.identical]
    assert all(r.new_tokens == 10 for r in records)
    auto = [r for r in records if r.method == "autoregressive"]
    assert all(r.target_forwards == 10 for r in auto)  # one forward per token
    # MetaSD rows keep each round's drafted and accepted counts (`recipes/benchmarks/bench_goals.py --diagnose` reads them)
    meta = [r for r in records if r.arms]
    assert meta and all(len(r.drafted) == len(r.accepted) == len(r.arms) for r in meta)
    assert all(a <= d for r in meta for a, d in zip(r.accepted, r.drafted))
    # and what a verification pass by length cost as the draft-length choice saw it (a plain step among them)
    assert all(r.verification_costs and all(s > 0 for s in r.verification_costs.values()) for r in meta)
    assert all(not r.verification_costs for r in auto)
    summary = summarize(records, [d.name for d in pool])
    # the oracle is fixed[<task>]: for qa prompts the exact copy accepts everything
    oracle_qa = summary["oracle"]["qa"]
    assert oracle_qa["mean_accepted_tokens"] >= 2.0 and oracle_qa["best_arm_ratio"] == 1.0
    assert summary["autoregressive"]["overall"]["mean_accepted_tokens"] == 1.0
    assert summary["autoregressive"]["overall"]["speedup"] == pytest.approx(1.0)
    report = write_report(records, [d.name for d in pool], tmp_path, meta={"test": True})
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["test"] is True and "commit" in saved["meta"]["machine"]
    assert "| ucb-bd |" in (tmp_path / "results.md").read_text()
    assert set(report["plots"]) == {"speedup.png", "arms.png"}
    assert (tmp_path / "speedup.png").stat().st_size > 1000


def test_the_oracle_is_the_fastest_single_drafter_of_each_task_in_hindsight():
    def record(method, task, seconds):
        return BenchRecord(method, task, f"{task}/0", seconds, 10, 5, True)

    records = [
        record("autoregressive", "qa", 4.0),
        record("autoregressive", "rag", 4.0),
        record("fixed[qa]", "qa", 3.0),
        record("fixed[rag]", "qa", 2.0),  # the drafter named after the other task wins on qa
        record("fixed[qa]", "rag", 1.0),
        record("fixed[rag]", "rag", 3.0),
    ]
    oracle = summarize(records, ["qa", "rag"])["oracle"]
    assert oracle["qa"]["seconds"] == 2.0 and oracle["rag"]["seconds"] == 1.0
    assert oracle["overall"]["speedup"] == pytest.approx(8.0 / 3.0)


def test_transformers_baselines_one_per_kind(bench_setup):
    pool, _, _ = bench_setup
    kinds = [m.name for m in build_methods(pool) if m.kind == "transformers"]
    # both drafters are assistant models: the first one stands for the kind, like for like and with transformers' defaults
    assert kinds == ["hf-assisted[qa]", "hf-assisted[qa] (hf defaults)"]
    assert not [m for m in build_methods(pool, transformers_baselines="none") if m.kind == "transformers"]
    defaults = [m.name for m in build_methods(pool, transformers_baselines="defaults") if m.kind == "transformers"]
    # every drafter with its transformers defaults, and transformers' prompt lookup, which the pool lacks
    assert defaults == [f"hf-assisted[{d.name}] (hf defaults)" for d in pool] + [
        "hf-assisted[prompt_lookup] (hf defaults)"
    ]
    with pytest.raises(
        ValueError, match=r"`transformers_baselines` must be 'all', 'kinds', 'defaults' or 'none', but is 'some'"
    ):
        build_methods(pool, transformers_baselines="some")


def test_a_pool_of_corpora_is_compared_with_transformers_prompt_lookup(target):
    from hf_metasd.drafters import CorpusDrafter

    pool = [CorpusDrafter.from_sequences([[1, 2, 3, 4]], name="corpus_a")]
    methods = {m.name: m for m in build_methods(pool, num_assistant_tokens=3) if m.kind == "transformers"}
    # no corpus has a transformers equivalent: transformers' prompt lookup stands in, like for like and with its defaults
    assert list(methods) == ["hf-assisted[prompt_lookup]", "hf-assisted[prompt_lookup] (hf defaults)"]
    assert methods["hf-assisted[prompt_lookup]"].kwargs(None)["prompt_lookup_num_tokens"] == 3
    assert methods["hf-assisted[prompt_lookup] (hf defaults)"].kwargs(None)["prompt_lookup_num_tokens"] == 10
    assert not [m for m in build_methods(pool, transformers_baselines="none") if m.kind == "transformers"]
    prompts = [BenchPrompt("qa", "qa/0", "0")]
    records = run_bench(
        target,
        None,
        prompts,
        list(methods.values()),
        max_new_tokens=6,
        progress=False,
        encode=lambda tokenizer, text: random_prompts(1, seed=3)[0],
        warm_up_tokens=0,
    )
    assert len(records) == 2 and all(r.new_tokens == 6 for r in records)


def test_full_information_traces_are_saved_and_replay(bench_setup, target, tmp_path):
    from hf_metasd.benchmark.simulate import replay

    pool, prompts, encode = bench_setup
    methods = [
        m for m in build_methods(pool, full_information=True) if m.name in ("autoregressive", "hedge (full info)")
    ]
    records = run_bench(target, None, prompts[:2], methods, max_new_tokens=10, progress=False, encode=encode)
    assert all(r.identical for r in records)
    write_report(records, [d.name for d in pool], tmp_path, meta={})
    traces = json.loads((tmp_path / "traces.json").read_text())
    assert set(traces) == {f"hedge (full info)|{p.id}" for p in prompts[:2]}
    trace = [{k: {int(a): v for a, v in d.items()} for k, d in r.items()} for r in next(iter(traces.values()))]
    assert replay("ucb", trace).rounds == len(trace)


def test_every_method_warms_up_once_untimed_in_a_memory_scope_the_timed_calls_never_read(bench_setup, target):
    from dataclasses import replace

    from hf_metasd.reward_memory import current_scope

    pool, prompts, encode = bench_setup
    seen: list[tuple] = []

    def spy(method):
        def kwargs(prompt):
            seen.append((method.name, prompt.id, current_scope()))
            return method.kwargs(prompt)

        return replace(method, kwargs=kwargs)

    methods = [spy(m) for m in build_methods(pool) if m.name in ("autoregressive", "metasd")]
    records = run_bench(target, None, prompts[:2], methods, max_new_tokens=6, progress=False, encode=encode)
    assert seen[:2] == [(name, prompts[0].id, ("warm-up", name)) for name in ("autoregressive", "metasd")]
    assert seen[2:] == [(name, p.id, name) for p in prompts[:2] for name in ("autoregressive", "metasd")]
    assert len(records) == 4 and all(r.identical and r.new_tokens == 6 for r in records)
    seen.clear()
    run_bench(target, None, prompts[:1], methods, max_new_tokens=6, progress=False, encode=encode, warm_up_tokens=0)
    assert [scope for *_, scope in seen] == ["autoregressive", "metasd"]


def test_bench_records_keep_each_rounds_reward_and_the_priors_learnt_from_earlier_calls(bench_setup, target):
    pool, prompts, encode = bench_setup
    methods = [m for m in build_methods(pool) if m.name in ("autoregressive", "metasd")]
    records = run_bench(target, None, prompts[:2], methods, max_new_tokens=6, progress=False, encode=encode)
    plain, first, _, second = records  # per prompt, the methods in order
    assert (first.method, second.method, second.prompt_id) == ("metasd", "metasd", prompts[1].id)
    assert plain.method == "autoregressive" and plain.rewards == [] and plain.learned_priors == {}
    for r in (first, second):  # one entry per round, None only where a round earned no reward
        assert len(r.rewards) == len(r.arms) and any(v is not None for v in r.rewards)
        assert all(v is None or 0.0 <= v <= 1.0 for v in r.rewards)
    # the warm-up learns in its own scope: the first timed call starts from nothing, the second from the first
    assert first.learned_priors == {} and second.learned_priors


def test_sub_pool_methods_draft_only_with_their_drafters(bench_setup, target):
    pool, prompts, encode = bench_setup
    methods = [m for m in build_methods(pool, sub_pools=[["rag"]]) if m.name in ("autoregressive", "metasd[rag]")]
    assert [m.name for m in build_methods(pool, sub_pools=[["qa", "rag"]])][-1] == "metasd[qa+rag]"
    records = run_bench(target, None, prompts[:2], methods, max_new_tokens=8, progress=False, encode=encode)
    sub = [r for r in records if r.method == "metasd[rag]"]
    assert all(r.identical for r in records)
    # arms are mapped back to pool indices: rag is arm 1, the no-draft arm is 2 (after the pool's drafters)
    # (the first call tries the rag arm; a later one may leave it out, having learnt its reward: learned priors)
    assert sub and all(set(r.arms) <= {1, 2} for r in sub) and 1 in sub[0].arms
    with pytest.raises(ValueError, match=r"`sub_pools` entries must name drafters of the pool \['qa', 'rag'\]"):
        build_methods(pool, sub_pools=[["code"]])


def test_the_policies_option_selects_methods_and_refuses_unknown_names_before_loading_anything():
    from hf_metasd.benchmark.methods import DEFAULT_POLICIES
    from hf_metasd.benchmark.run import run_benchmark, select_policies

    assert select_policies(None, DEFAULT_POLICIES[:2]) == tuple(DEFAULT_POLICIES[:2])
    assert select_policies([], DEFAULT_POLICIES) == ()
    assert [m[0] for m in select_policies(["exp3", "ucb-speed"], DEFAULT_POLICIES)] == ["ucb-speed", "exp3"]
    with pytest.raises(ValueError, match=r"`--policies` must name methods of the benchmark, but names \['ucb'\]\. "):
        run_benchmark(models="no-such-models", policies=["ucb"])  # raised before the models are loaded


def test_drafter_dtype_is_refused_for_pools_that_store_their_dtypes_before_loading_anything():
    from hf_metasd.benchmark.run import run_benchmark, run_demo

    message = r"`drafter_dtype` must be None for a pool loaded from a folder or the embedded pool .* but is 'bfloat16'"
    with pytest.raises(ValueError, match=message + r" with models='smollm2', pool=None\. Drop --drafter-dtype"):
        run_benchmark(drafter_dtype="bfloat16")
    with pytest.raises(ValueError, match=message + r" with models='qwen', pool='my-pool'\. "):
        run_demo("hi", models="qwen", pool="my-pool", drafter_dtype="bfloat16")


def test_the_qwen_pool_priors_name_its_arms_and_follow_the_recipes_formula():
    # `recipes/pools/qwen_pool_priors.py`: prior = (speed alone over plain) / (N + 1), the no-draft arm 1 / (N + 1)
    from hf_metasd.benchmark.run import QWEN_ARMS, QWEN_POOL_FILE
    from hf_metasd.generation import DEFAULTS
    from hf_metasd.pool.config import validate_priors

    record = json.loads(QWEN_POOL_FILE.read_text())
    priors, n = record["priors"], record["measured_on"]["num_assistant_tokens"]
    assert set(priors) == {*QWEN_ARMS, "no_draft"}
    validate_priors(priors, None, list(QWEN_ARMS), DEFAULTS["meta_policy"], DEFAULTS["meta_reward"])
    assert priors["no_draft"] == pytest.approx(1 / (n + 1), abs=1e-4)
    for arm in QWEN_ARMS:
        speedup = record["seconds"]["plain"] / record["seconds"][arm]
        assert priors[arm] == pytest.approx(min(1.0, speedup / (n + 1)), abs=1e-3)


def test_the_qwen_pool_corpus_ships_in_binary_form_and_matches_its_record():
    # `recipes/pools/build_qwen_corpus.py`: the 1.5B target's own answers, one corpus over every task, no JSON of tokens
    from hf_metasd.benchmark.run import QWEN_CORPUS_DIR
    from hf_metasd.drafters import CorpusDrafter

    record = json.loads((QWEN_CORPUS_DIR / "corpus.json").read_text())
    drafter = CorpusDrafter.from_folder(QWEN_CORPUS_DIR, name="corpus_all", context_lookup=True)
    documents = drafter.index.documents()
    assert sum(len(d) for d in documents) == record["tokens"] == sum(t["tokens"] for t in record["per_task"].values())
    assert len(documents) == sum(t["prompts"] for t in record["per_task"].values())
    assert drafter.index.max_token_id < 151_936  # Qwen2.5's vocabulary
    assert sorted(p.name for p in QWEN_CORPUS_DIR.iterdir()) == ["corpus.json", "corpus.safetensors"]


def test_bench_runs_a_users_own_prompts_file(bench_setup, target, tmp_path, monkeypatch):
    from hf_metasd.benchmark import offline, run
    from hf_metasd.pool import DrafterPool

    pool, _, encode = bench_setup
    lines = [
        {"task": "chat", "prompt": "0"},
        {"task": "code", "prompt": "1", "id": "mine"},
        {"task": "chat", "prompt": "2"},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    monkeypatch.setattr(run, "load_models", lambda *args: (target, None))
    monkeypatch.setattr(run, "load_pool", lambda *args: DrafterPool(pool, target=target))
    monkeypatch.setattr(offline, "chat_prompt", encode)
    printed = []
    out = tmp_path / "out"
    code = run.run_benchmark(
        prompts=path,
        out=out,
        quick=True,
        policies=[],
        max_new_tokens=6,
        per_task=1,
        print_fn=printed.append,
        dtype="float32",  # the pool was built for the float32 target (auto may measure bfloat16 faster)
    )
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    ids = {r["prompt_id"] for r in results["records"]}
    assert ids == {"mine.jsonl/1", "mine"}  # per_task=1 keeps the first `chat` prompt and the `code` one
    assert results["meta"]["prompts"] == str(path)
    assert {"chat", "code"} <= set(results["summary"]["metasd"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json\n", r"every line of `prompts` must be a JSON object, but bad.jsonl line 1 is not JSON"),
        ('{"task": "a"}\n', r"must be an object with string keys `task` and `prompt`, but bad.jsonl line 1 is"),
        ('{"task": "a", "prompt": " "}\n', r"a prompt must have 1 to 200000 characters, but bad.jsonl line 1 has 1\."),
        ("\n", r"`prompts` must hold at least one prompt, but bad.jsonl has none\. Add lines\."),
    ],
)
def test_a_bad_prompts_file_is_refused_before_any_model_loads(tmp_path, text, message):
    from hf_metasd.benchmark.run import run_benchmark

    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        run_benchmark(models="no-such-models", prompts=path)  # raised before the models are loaded


def test_a_prompts_file_refuses_tasks_it_does_not_hold(tmp_path):
    from hf_metasd.benchmark.prompts import load_prompts_file

    path = tmp_path / "p.jsonl"
    path.write_text('{"task": "a", "prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"`tasks` must be tasks of p.jsonl \['a'\], but has \['b'\]\. "):
        load_prompts_file(path, tasks=["b"])
    with pytest.raises(FileNotFoundError, match=r"`prompts` must be a JSON Lines file, but .* is not a file"):
        load_prompts_file(tmp_path / "missing.jsonl")


def _record(method, prompt, divergence=None, seconds=1.0):
    from hf_metasd.benchmark.records import BenchRecord

    return BenchRecord(method, "chat", prompt, seconds, 8, 8, divergence is None, divergence=divergence)


def _divergence(near_tie: bool, gap: float) -> dict:
    from hf_metasd.lossless import Divergence

    return Divergence(3, 10, 11, gap, 0.5, near_tie, "bfloat16").to_dict()


def test_the_report_counts_near_ties_and_errors_apart():
    from hf_metasd.benchmark.report import _markdown, summarize

    records = [
        _record("autoregressive", "p1"),
        _record("autoregressive", "p2"),
        _record("metasd", "p1", _divergence(True, -0.12)),
        _record("metasd", "p2", _divergence(True, 0.3)),
        _record("other", "p1", _divergence(False, 2.5)),
        _record("other", "p2"),
    ]
    summary = summarize(records, [])
    metasd, other = summary["metasd"]["overall"], summary["other"]["overall"]
    assert (metasd["identical"], metasd["near_ties"], metasd["largest_near_tie_gap"], metasd["errors"]) == (
        0.0,
        2,
        0.3,
        0,
    )
    assert (other["identical"], other["near_ties"], other["errors"]) == (0.5, 0, 1)
    table = _markdown(summary, ["chat"])
    assert "| identical | near-ties | errors |" in table
    assert "| 0.00 | 2 | 0 |" in table and "| 0.50 | 0 | 1 |" in table


@pytest.mark.parametrize(("near_tie", "code"), [(True, 0), (False, 1)])
def test_the_bench_fails_only_on_divergences_that_are_not_near_ties(
    bench_setup, target, tmp_path, monkeypatch, near_tie, code
):
    from hf_metasd.benchmark import run
    from hf_metasd.pool import DrafterPool

    pool, _, _ = bench_setup
    monkeypatch.setattr(run, "load_models", lambda *args: (target, None))
    monkeypatch.setattr(run, "load_pool", lambda *args: DrafterPool(pool, target=target))
    fake = [_record("autoregressive", "p1"), _record("metasd", "p1", _divergence(near_tie, 0.2 if near_tie else 3.0))]
    monkeypatch.setattr(run, "run_bench", lambda *args, **kwargs: fake)
    printed = []
    result = run.run_benchmark(out=tmp_path, quick=True, policies=[], dtype="float32", print_fn=printed.append)
    assert result == code
    text = "\n".join(printed)
    if near_tie:
        assert "1 of 2 outputs left plain greedy output at a float32 near-tie (largest float32 logit gap 0.200" in text
        assert "ERROR" not in text
    else:
        assert (
            "ERROR: 1 outputs differ from autoregressive greedy other than at a near-tie: [('metasd', 'p1')]" in text
        )


# ---------------------------------------------------------------------------------------------------------------------
# issue 50: what the bench refuses before any model loads (the flags that ran something else, or nothing)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def no_models(monkeypatch):
    """`run_benchmark` / `run_demo` with model loading replaced by a failure: a check must come first."""
    from hf_metasd.benchmark import run

    def load(*args, **kwargs):
        raise AssertionError("a model loaded before the options were checked")

    monkeypatch.setattr(run, "load_target", load)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"num_assistant_tokens": 0},
            r"`num_assistant_tokens` must be an int in \[1, 128\] or None \(the pool's\), but is 0\. Pass e\.g\. "
            r"`--num-assistant-tokens 3`, or leave it out for the pool's draft length\.",
        ),
        ({"num_assistant_tokens": 129}, r"`num_assistant_tokens` must be an int in \[1, 128\] .* but is 129\."),
        (
            {"per_task": 0},
            r"`per_task` must be an int >= 1 or None \(3 prompts per task; 1 with `quick`\), but is 0\. Pass e\.g\. "
            r"`--per-task 3`, or leave it out\.",
        ),
        (
            {"max_new_tokens": 0},
            r"`max_new_tokens` must be an int >= 1 or None \(64; 48 with `quick`\), but is 0\. Pass e\.g\. "
            r"`--max-new-tokens 64`, or leave it out\.",
        ),
        ({"threads": 0}, r"`threads` must be an int >= 1, but is 0\. Pass e\.g\. `--threads 2`\."),
        ({"untrained": -1}, r"`untrained` must be an int >= 0, but is -1\. Pass e\.g\. `--untrained 2`, or 0 for "),
        ({"tasks": ["qa", "chat"]}, r"`tasks` must be among \['mt_bench', .*\], but has \['chat'\]\. Drop or fix"),
    ],
)
def test_flags_that_would_run_something_else_or_nothing_are_refused_before_any_model_loads(
    no_models, tmp_path, options, message
):
    from hf_metasd.benchmark.run import run_benchmark
    from hf_metasd.errors import BenchmarkConfigError

    with pytest.raises(BenchmarkConfigError, match=message):
        run_benchmark(out=tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()


def test_the_demo_refuses_what_it_cannot_run_before_any_model_loads(no_models, tmp_path):
    from hf_metasd.benchmark.run import run_demo
    from hf_metasd.errors import BenchmarkConfigError, InvalidPoolError

    with pytest.raises(BenchmarkConfigError, match=r"`max_new_tokens` must be an int >= 1, but is 0\. Pass e\.g\. "):
        run_demo("hi", max_new_tokens=0)
    with pytest.raises(BenchmarkConfigError, match=r"`threads` must be an int >= 1, but is 0\."):
        run_demo("hi", threads=0)
    with pytest.raises(InvalidPoolError, match=r"`pool` must be a pool folder or a Hub repo id, but '.*missing' does"):
        run_demo("hi", pool=str(tmp_path / "missing"))


def test_an_out_path_that_is_a_file_is_refused_before_any_model_loads(no_models, tmp_path):
    """Issue 50: the whole benchmark ran, then `FileExistsError` lost its results."""
    from hf_metasd.benchmark.run import run_benchmark
    from hf_metasd.errors import BenchmarkConfigError

    (tmp_path / "results").write_text("mine")
    with pytest.raises(
        BenchmarkConfigError,
        match=r"`out` must be a folder to write the results in, but '.*results' is a file\. Pass another folder "
        r"with `--out`, or move the file away\.",
    ):
        run_benchmark(out=tmp_path / "results")
    with pytest.raises(BenchmarkConfigError, match=r"`out` must be a folder .* but '.*results' is a file\."):
        run_benchmark(out=tmp_path / "results" / "inside", batch_size=4)
    assert (tmp_path / "results").read_text() == "mine"


@pytest.mark.parametrize("pool", ["missing", "a_file"])
def test_a_pool_path_that_is_no_folder_is_refused_naming_the_option_before_any_model_loads(no_models, tmp_path, pool):
    from hf_metasd.benchmark.run import run_benchmark
    from hf_metasd.errors import InvalidPoolError

    (tmp_path / "a_file").write_text("{}")
    what = "does not exist" if pool == "missing" else "is a file"
    with pytest.raises(
        InvalidPoolError,
        match=rf"`pool` must be a pool folder or a Hub repo id, but '.*{pool}' {what}\. Pass a pool folder "
        r"\(`DrafterPool\.save_pretrained`\) or a Hub repo id with `--pool`, or leave it out for the embedded pool\.",
    ):
        run_benchmark(out=tmp_path / "out", pool=str(tmp_path / pool))


def test_a_prompts_file_with_a_byte_order_mark_is_read(tmp_path):
    from hf_metasd.benchmark.prompts import load_prompts_file

    path = tmp_path / "bom.jsonl"
    path.write_text(
        '{"task": "chat", "prompt": "Café?"}\r\n{"task": "chat", "prompt": "Hi"}\r\n', encoding="utf-8-sig"
    )
    assert [(p.task, p.text) for p in load_prompts_file(path)] == [("chat", "Café?"), ("chat", "Hi")]


def test_a_prompts_file_that_is_not_utf8_is_refused_naming_the_file_and_the_encoding(no_models, tmp_path):
    from hf_metasd.benchmark.run import run_benchmark
    from hf_metasd.errors import BenchmarkConfigError

    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"task": "chat", "prompt": "Hi"}\n{"task": "chat", "prompt": "Café?"}\n'.encode("latin-1"))
    with pytest.raises(
        BenchmarkConfigError,
        match=r"`prompts` must be a UTF-8 text file, but latin\.jsonl line 2 is not UTF-8 \(byte 0xe9 at byte 32 of "
        r"the line\)\. Save the file as UTF-8\.",
    ):
        run_benchmark(out=tmp_path / "out", prompts=path)
    path.write_bytes(path.read_bytes().decode("latin-1").encode("utf-8"))  # the fix
    with pytest.raises(AssertionError, match="a model loaded"):  # the file was read, then the models load
        run_benchmark(out=tmp_path / "out", prompts=path)
