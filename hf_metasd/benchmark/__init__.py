"""Tooling around the library: the benchmark, the simulator, the benchmark prompts and offline model loading.

Nothing in the core (`hf_metasd.generate` and what it calls) imports from here.

* `prompts`: Spec-Bench + HumanEval prompts shipped in ``data/`` (benchmark only; never train on them).
* `offline`: the default target (SmolLM2-135M-Instruct) and Qwen2.5-Coder from PyPI wheels; the embedded pool.
* `methods`: what a benchmark compares (`build_methods`); `run`: running it (`run_bench`) and the ``hf-metasd``
  jobs; `options`: what those jobs refuse before any model loads; `report`: metrics, the hindsight oracle,
  `results.json`, tables and plots.
* `simulate`: stopping-time regret of every policy on simulated drafters.
"""
