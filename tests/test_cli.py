"""`hf-metasd` as a user meets it: a bad option or input file ends the command with one line on stderr and exit
status 2, as argparse's own errors do, before any model loads; a bug still shows its traceback."""

from __future__ import annotations

import pytest

from hf_metasd.cli import main


@pytest.fixture(autouse=True)
def no_models(monkeypatch):
    from hf_metasd.benchmark import run

    def load(*args, **kwargs):
        raise AssertionError("a model loaded before the options were checked")

    monkeypatch.setattr(run, "load_target", load)


def _error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    assert captured.err.endswith("\n") and captured.err.count("\n") == 1, captured.err  # one line, no traceback
    return captured.err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["bench", "--num-assistant-tokens", "0"],
            "hf-metasd bench: error: `num_assistant_tokens` must be an int in [1, 128] or None (the pool's), but is 0. "
            "Pass e.g. `--num-assistant-tokens 3`, or leave it out for the pool's draft length.\n",
        ),
        (
            ["bench", "--per-task", "0"],
            "hf-metasd bench: error: `per_task` must be an int >= 1 or None (3 prompts per task; 1 with `quick`), but "
            "is 0. Pass e.g. `--per-task 3`, or leave it out.\n",
        ),
        (
            ["bench", "--max-new-tokens", "0"],
            "hf-metasd bench: error: `max_new_tokens` must be an int >= 1 or None (64; 48 with `quick`), but is 0. "
            "Pass e.g. `--max-new-tokens 64`, or leave it out.\n",
        ),
        (
            ["bench", "--threads", "0"],
            "hf-metasd bench: error: `threads` must be an int >= 1, but is 0. Pass e.g. `--threads 2`.\n",
        ),
        (
            ["demo", "--threads", "0"],
            "hf-metasd demo: error: `threads` must be an int >= 1, but is 0. Pass e.g. `--threads 2`.\n",
        ),
        (
            ["bench", "--policies", "ucb"],
            "hf-metasd bench: error: `--policies` must name methods of the benchmark, but names ['ucb']. Choose among "
            "['ucb-speed', ",  # the methods' list, then "or give none to run only `metasd`."
        ),
    ],
)
def test_a_bad_option_is_one_line_on_stderr_and_exit_status_2(capsys, tmp_path, argv, line):
    out = ["--out", str(tmp_path / "out")] if argv[0] == "bench" else []
    assert _error_line(capsys, [*argv, *out]).startswith(line)


def test_a_missing_pool_folder_names_the_option(capsys, tmp_path):
    missing = str(tmp_path / "missing")
    assert _error_line(capsys, ["demo", "--pool", missing]) == (
        f"hf-metasd demo: error: `pool` must be a pool folder or a Hub repo id, but {missing!r} does not exist. Pass a "
        "pool folder (`DrafterPool.save_pretrained`) or a Hub repo id with `--pool`, or leave it out for the embedded "
        "pool.\n"
    )


def test_an_out_path_that_is_a_file_and_a_prompts_file_that_is_not_utf8_are_one_line(capsys, tmp_path):
    (tmp_path / "results").write_text("mine")
    line = _error_line(capsys, ["bench", "--out", str(tmp_path / "results")])
    assert line.startswith("hf-metasd bench: error: `out` must be a folder to write the results in, but ")
    (tmp_path / "p.jsonl").write_bytes(b'{"task": "a", "prompt": "\xe9"}\n')
    line = _error_line(capsys, ["bench", "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "out")])
    assert line.startswith("hf-metasd bench: error: `prompts` must be a UTF-8 text file, but p.jsonl line 1 is not")
    line = _error_line(capsys, ["bench", "--prompts", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "out")])
    assert line.startswith("hf-metasd bench: error: `prompts` must be a JSON Lines file, but ")


def test_a_folder_the_repository_cannot_be_written_into_is_one_line(capsys, tmp_path):
    (tmp_path / "README.md").write_text("mine")
    line = _error_line(capsys, ["custom-generate-repo", str(tmp_path / "README.md")])
    assert line.startswith("hf-metasd custom-generate-repo: error: `folder` must be a folder, but ")


@pytest.mark.parametrize("error", [ValueError("a bug"), TypeError("a bug"), RuntimeError("a bug")])
def test_an_error_that_is_no_refused_input_keeps_its_traceback(monkeypatch, error):
    """Only hf_metasd's own errors for bad input become a usage error: a bug is not hidden behind exit status 2."""
    from hf_metasd.benchmark import run

    def fail(**kwargs):
        raise error

    monkeypatch.setattr(run, "run_benchmark", fail)
    with pytest.raises(type(error), match="a bug"):
        main(["bench"])
