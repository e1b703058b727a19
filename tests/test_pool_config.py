"""A pool's `config.json` without models: format versions, unknown keys, refusing to save an invalid config, priors,
the tokenizer fingerprint field, defaults from `hf_metasd.generation.DEFAULTS`, the model card. No network."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import pytest

import hf_metasd
from hf_metasd.drafters import DRAFTER_KINDS, Drafter, PromptLookupDrafter, tokenizer_fingerprint
from hf_metasd.errors import InvalidPoolError, InvalidPoolTypeError
from hf_metasd.generation import DEFAULTS
from hf_metasd.policies import get_policy
from hf_metasd.pool import FORMAT_VERSION, DrafterPool, DrafterPoolConfig, DrafterSpec

# the embedded pool as shipped before the pool/ layout
EMBEDDED = Path(__file__).parent / "data" / "pool_config_format1.json"


def _data(**top) -> dict:
    config = DrafterPoolConfig(drafters=[DrafterSpec("prompt_lookup", "pl", params={"max_matching_ngram_size": 2})])
    data = json.loads(config.to_json_string())
    data.update(top)
    return data


def _ours(caught) -> list[str]:
    return [str(w.message) for w in caught if "hf_metasd" in str(w.message)]


# ---------------------------------------------------------------------------------------------------------------------
# format versions (issue 13 §7, §8)
# ---------------------------------------------------------------------------------------------------------------------
def test_a_newer_format_is_refused_naming_both_versions_and_the_upgrade(tmp_path):
    data = _data(format_version=FORMAT_VERSION + 1, hf_metasd_version="9.0.0")  # no unknown key involved
    (tmp_path / "config.json").write_text(json.dumps(data))
    installed = re.escape(hf_metasd.__version__)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(
            InvalidPoolError,
            match=rf"config\.json must be in a pool format this hf_metasd reads \(format <= {FORMAT_VERSION}\), but it "
            rf"is format {FORMAT_VERSION + 1}, written by hf_metasd 9\.0\.0; this is hf_metasd "
            rf"{installed}, which reads format {FORMAT_VERSION}\. Upgrade hf_metasd "
            r"\(`pip install -U hf-metasd`\) to load this pool\.",
        ):
            DrafterPoolConfig.from_json_file(tmp_path / "config.json")
    assert _ours(caught) == []  # an error, not a warning


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (-3, "-3"), (None, "missing"), (True, "True"), ("1", "'1'")])
def test_format_version_must_be_an_int_of_at_least_one(value, shown):
    data = _data()
    if value is None:
        del data["format_version"]
    else:
        data["format_version"] = value
    with pytest.raises(
        InvalidPoolError,
        match=rf"config\.json `format_version` must be an int >= 1, but is {shown}\. Re-save the pool with "
        r"`DrafterPool\.save_pretrained`\.",
    ):
        DrafterPoolConfig.from_dict(data)


def test_an_in_memory_config_with_a_bad_format_version_is_not_saved(tmp_path):
    config = DrafterPoolConfig(drafters=[DrafterSpec("prompt_lookup", "pl")], format_version=0)
    with pytest.raises(InvalidPoolError, match=r"`format_version` must be an int >= 1, but is 0"):
        config.save(tmp_path / "pool")
    config.format_version = FORMAT_VERSION + 1
    with pytest.raises(InvalidPoolError, match=rf"but it is format {FORMAT_VERSION + 1}"):
        config.save(tmp_path / "pool")
    assert not (tmp_path / "pool").exists()


def test_unknown_keys_in_a_readable_format_give_one_warning_naming_them():
    data = _data(speculative_magic=3, hf_metasd_version="9.0.0")
    data["drafters"][0]["warp_factor"] = 9
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = DrafterPoolConfig.from_dict(data)
    (message,) = _ours(caught)
    assert "['speculative_magic', 'drafters[0].warp_factor']" in message and "9.0.0" in message
    assert "Upgrade hf_metasd" in message
    assert config.drafters[0].name == "pl"


@pytest.mark.parametrize("retired", [{"meta_prefill_gate": "measured, it did not help"}, ("meta_prefill_gate",)])
def test_a_retired_setting_is_dropped_with_one_warning_naming_it(tmp_path, monkeypatch, retired):
    """A pool written when `meta_prefill_gate` was a setting still loads; the key is named once and dropped."""
    monkeypatch.setattr(hf_metasd.settings, "RETIRED_SETTINGS", retired)  # read at load time
    data = _data(meta_prefill_gate=True)
    (tmp_path / "config.json").write_text(json.dumps(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = DrafterPoolConfig.from_json_file(tmp_path / "config.json")
    (message,) = _ours(caught)
    assert "sets ['meta_prefill_gate'], settings this hf_metasd" in message and "no longer reads" in message
    assert ("measured, it did not help" in message) == isinstance(retired, dict)
    assert "Upgrade hf_metasd" not in message  # not a key of a newer version
    config.validate()
    assert "meta_prefill_gate" not in config.to_json_string()  # dropped: saving again writes the pool without it
    assert config.to_dict() == DrafterPoolConfig.from_dict(_data()).to_dict()


def test_retired_and_unknown_keys_together_give_one_warning_naming_both(monkeypatch):
    monkeypatch.setattr(hf_metasd.settings, "RETIRED_SETTINGS", {"meta_prefill_gate": "measured, it did not help"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DrafterPoolConfig.from_dict(_data(meta_prefill_gate=False, speculative_magic=3))
    (message,) = _ours(caught)
    assert "['meta_prefill_gate']" in message and "ignored: ['speculative_magic']" in message


def test_the_embedded_pool_config_still_loads_unchanged():
    """Written before this layout: same fields, no warning, and it saves back byte for byte."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = DrafterPoolConfig.from_json_file(EMBEDDED)
    config.validate()
    assert config.reward == "bd" and config.format_version == 1
    assert config.to_json_string() == EMBEDDED.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------------
# an invalid config is never written
# ---------------------------------------------------------------------------------------------------------------------
def test_saving_a_config_with_an_unknown_policy_writes_nothing(tmp_path):
    config = DrafterPoolConfig(drafters=[DrafterSpec("prompt_lookup", "pl")], policy="oracle")
    with pytest.raises(InvalidPoolError, match=r"pool policy 'oracle' with \{\} is invalid: `meta_policy` must be"):
        config.save(tmp_path)
    assert not (tmp_path / "config.json").exists()
    config.policy = "ucb"  # the fix
    assert config.save(tmp_path) == tmp_path / "config.json"


def test_validate_asks_the_kind(monkeypatch):
    """Kind-specific checks live on the kind (`validate_spec`), here the corpus kind's 'always stored'."""
    spec = DrafterSpec("corpus", "c", params={})
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'c' \(drafters\[0\]\) must be stored in the pool \(`stored: true` and a `path` such as "
        r'"corpus/c"\), but has stored=False, path=None\.',
    ):
        DrafterPoolConfig(drafters=[spec]).validate()

    class Picky(PromptLookupDrafter):
        kind = "picky"

        @classmethod
        def validate_spec(cls, spec, where):
            raise InvalidPoolError(f"{where} is never good enough")

    monkeypatch.setitem(DRAFTER_KINDS, "picky", Picky)
    with pytest.raises(InvalidPoolError, match=r"drafter 'p' \(drafters\[1\]\) is never good enough"):
        DrafterPoolConfig(drafters=[DrafterSpec("prompt_lookup", "pl"), DrafterSpec("picky", "p")]).validate()


# ---------------------------------------------------------------------------------------------------------------------
# defaults come from hf_metasd.generation.DEFAULTS
# ---------------------------------------------------------------------------------------------------------------------
def test_pool_and_config_defaults_are_the_librarys():
    pool = DrafterPool([PromptLookupDrafter()])
    config = DrafterPoolConfig()
    for key, attribute in (("meta_policy", "policy"), ("meta_reward", "reward")):
        assert getattr(pool, attribute) == getattr(config, attribute) == DEFAULTS[key]
    assert pool.num_assistant_tokens == config.num_assistant_tokens == DEFAULTS["num_assistant_tokens"]
    assert pool.reward == "speed"


# ---------------------------------------------------------------------------------------------------------------------
# priors (issue 12 §4)
# ---------------------------------------------------------------------------------------------------------------------
PRIOR_ERRORS = {
    "unknown name": (
        {"priors": {"pl": 0.5, "pm": 0.4}},
        r"pool `priors` must name the pool's drafters \['pl', 'lookup'\] or 'no_draft', but has 'pm'\. Fix the name",
    ),
    "above one": (
        {"priors": {"pl": 1.5}},
        r"pool `priors\['pl'\]` must be a float in \[0, 1\], but is 1\.5\. Use the drafter's mean reward",
    ),
    "nan": (
        {"priors": {"no_draft": math.nan}},
        r"pool `priors\['no_draft'\]` must be a float in \[0, 1\], but is nan",
    ),
    "bool": ({"priors": {"pl": True}}, r"pool `priors\['pl'\]` must be a float in \[0, 1\], but is True"),
    "weight zero": (
        {"priors": {"pl": 0.5}, "prior_weight": 0},
        r"pool `prior_weight` must be a float in \(0, inf\), but is 0\. Use e\.g\. 2\.0",
    ),
    "weight alone": (
        {"prior_weight": 2.0},
        r"pool `prior_weight` must be None when there are no `priors`, but is 2\.0\. Set `priors`",
    ),
    "no_draft without a cost-aware reward": (
        {"priors": {"no_draft": 0.4}, "reward": "bd"},
        r"pool `priors` may name 'no_draft' only with a cost-aware reward \['speed'\] \(the only ones that can score "
        r"the no-draft arm\), but the pool's reward is 'bd'\. Use e\.g\. reward \"speed\", or drop",
    ),
    "not a dict": (
        {"priors": [0.5]},
        r"pool `priors` must be a dict \{drafter name: prior mean reward\}, but is list",
    ),
    "policy without means": (
        {"priors": {"pl": 0.5}, "policy": "exp3"},
        r"pool `priors` need a policy that keeps a mean reward per drafter, but policy 'exp3' does not\. Use one of "
        r"\[.*'ucb'.*\], or drop `priors`\.",
    ),
}


#: the cases above whose value has the wrong type: their error is also a `TypeError` (`InvalidPoolTypeError`)
WRONG_TYPE_PRIORS = {"bool", "not a dict"}


@pytest.mark.parametrize("case", sorted(PRIOR_ERRORS))
def test_bad_priors_are_refused_by_the_pool_and_the_config(case):
    settings, match = PRIOR_ERRORS[case]
    drafters = [PromptLookupDrafter(name="pl"), PromptLookupDrafter(name="lookup")]
    with pytest.raises(InvalidPoolError, match=match) as caught:
        DrafterPool(drafters, **settings)
    assert isinstance(caught.value, TypeError) == (case in WRONG_TYPE_PRIORS)
    specs = [DrafterSpec("prompt_lookup", "pl"), DrafterSpec("prompt_lookup", "lookup")]
    with pytest.raises(InvalidPoolError, match=match) as caught:
        DrafterPoolConfig(drafters=specs, **settings).validate()
    assert isinstance(caught.value, TypeError) == (case in WRONG_TYPE_PRIORS)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (
            {"policy": get_policy("ucb")},
            r"pool `policy` must be a registered policy name \(instances cannot be saved\)",
        ),
        ({"reward": len}, r"pool `reward` must be a reward name in \[.*\] \(callables cannot be saved\), but is"),
        ({"num_assistant_tokens": "3"}, r"pool `num_assistant_tokens` must be an int >= 1, but is '3'\. Use e\.g\. 3"),
        ({"policy_kwargs": {"beta": object()}}, r"pool `policy_kwargs` must be JSON-serialisable to be saved"),
    ],
)
def test_pool_defaults_of_the_wrong_type_are_type_errors(settings, match):
    with pytest.raises(InvalidPoolTypeError, match=match) as caught:
        DrafterPool([PromptLookupDrafter()], **settings)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, InvalidPoolError)
    with pytest.raises(InvalidPoolError, match=r"pool `num_assistant_tokens` must be an int >= 1, but is 0") as caught:
        DrafterPool([PromptLookupDrafter()], num_assistant_tokens=0)  # a bad value stays a ValueError only
    assert not isinstance(caught.value, TypeError)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.update(num_assistant_tokens="3"), r"config\.json `num_assistant_tokens` must be int, but is '3'"),
        (
            lambda d: d["drafters"][0].update(stored="yes"),
            r"config\.json `drafters\[0\]\.stored` must be bool, but is",
        ),
        (lambda d: d.update(format_version="1"), r"config\.json `format_version` must be an int >= 1, but is '1'"),
        (lambda d: d.update(drafters=["pl"]), r"config\.json `drafters\[0\]` must be a JSON object, but is str"),
        (lambda d: d.update(tokenizer_hash=5), r"config\.json `tokenizer_hash` must be str or null, but is 5\. Fix"),
    ],
)
def test_a_config_field_of_the_wrong_type_is_a_type_error(edit, match):
    data = _data()
    edit(data)
    with pytest.raises(InvalidPoolTypeError, match=match):
        DrafterPoolConfig.from_dict(data).validate()
    with pytest.raises(InvalidPoolError, match=r"must be an int >= 1, but is 0") as caught:
        DrafterPoolConfig.from_dict(_data(format_version=0))
    assert not isinstance(caught.value, TypeError)
    config = DrafterPoolConfig([DrafterSpec("prompt_lookup", "pl")], tokenizer_hash=5)  # in memory, not parsed
    with pytest.raises(InvalidPoolTypeError, match=r"pool `tokenizer_hash` must be a sha256 hex digest .*, but is 5"):
        config.validate()


def test_priors_of_repeated_names_use_the_arm_names_a_call_reports():
    drafters = [PromptLookupDrafter(name="pl"), PromptLookupDrafter(name="pl", max_matching_ngram_size=3)]
    with pytest.raises(InvalidPoolError, match=r"must name the pool's drafters \['pl#0', 'pl#1'\] or 'no_draft'"):
        DrafterPool(drafters, priors={"pl": 0.5})
    pool = DrafterPool(drafters, priors={"pl#1": 0.5})  # the fix: the names generate reports
    assert pool.to_config().priors == {"pl#1": 0.5}


def test_priors_round_trip_through_json_and_reach_generate_kwargs():
    pool = DrafterPool([PromptLookupDrafter(name="pl")], priors={"pl": 0.7, "no_draft": 0.2}, prior_weight=3.0)
    kwargs = pool.generate_kwargs()
    assert kwargs["meta_priors"] == {"pl": 0.7, "no_draft": 0.2} and kwargs["meta_prior_weight"] == 3.0
    config = pool.to_config()
    data = json.loads(config.to_json_string())
    assert data["priors"] == {"no_draft": 0.2, "pl": 0.7} and data["prior_weight"] == 3.0
    assert DrafterPoolConfig.from_dict(data) == config
    plain = DrafterPool([PromptLookupDrafter()]).generate_kwargs()
    assert plain["meta_priors"] is None and plain["meta_prior_weight"] is None


def test_unset_optional_fields_are_left_out_of_the_file():
    """So that an older hf_metasd reads a pool without priors or fingerprint without a warning."""
    data = json.loads(DrafterPool([PromptLookupDrafter()]).to_config().to_json_string())
    assert not {"priors", "prior_weight", "tokenizer_hash"} & set(data)


# ---------------------------------------------------------------------------------------------------------------------
# tokenizer fingerprint field
# ---------------------------------------------------------------------------------------------------------------------
def test_tokenizer_hash_must_be_a_fingerprint():
    config = DrafterPoolConfig(drafters=[DrafterSpec("prompt_lookup", "pl")], tokenizer_hash="abc")
    with pytest.raises(
        InvalidPoolError,
        match=r"pool `tokenizer_hash` must be a sha256 hex digest from `tokenizer_fingerprint`, but is 'abc'",
    ):
        config.validate()
    config.tokenizer_hash = tokenizer_fingerprint(type("T", (), {"get_vocab": lambda self: {"a": 0}})())
    config.validate()  # the fix
    with pytest.raises(TypeError, match=r"`tokenizer` must be a tokenizer with `get_vocab\(\)`, but is str"):
        tokenizer_fingerprint("gpt2")


# ---------------------------------------------------------------------------------------------------------------------
# the model card
# ---------------------------------------------------------------------------------------------------------------------
def test_the_card_of_an_exp3_pool_names_the_policy_with_its_settings():
    card = str(DrafterPool([PromptLookupDrafter()], policy="exp3", policy_kwargs={"gamma": 0.2}).generate_model_card())
    assert "policy `exp3 (gamma=0.2)`" in card and "reward `speed`" in card
    card = str(DrafterPool([PromptLookupDrafter()], policy="exp3").generate_model_card())
    assert "policy `exp3 (gamma=0.1)`" in card  # the settings it runs with, defaults included
    pool = DrafterPool([PromptLookupDrafter()], policy="ucb", policy_kwargs={"beta": 0.5, "seed": 3})
    card = str(pool.generate_model_card())
    assert "policy `ucb (beta=0.5, seed=3)`" in card


def test_the_card_lists_the_priors_and_the_hub_metadata():
    pool = DrafterPool([PromptLookupDrafter(name="pl")], priors={"pl": 0.7, "no_draft": 0.25}, prior_weight=3.0)
    card = str(pool.generate_model_card(repo_id="me/pool"))
    assert "each worth `prior_weight=3` rounds" in card
    assert "| `pl` | 0.7 |" in card and "| `no_draft` | 0.25 |" in card
    assert "library_name: hf_metasd" in card and "- speculative-decoding" in card
    assert 'DrafterPool.from_pretrained("me/pool", target=target)' in card


class _Unsaveable(Drafter):
    kind = "unsaveable"

    def config(self):
        return {"table": object()}

    def draft(self, input_ids, num_tokens, *, logits_processor=None, do_sample=False):
        return input_ids[:, :0], None


def test_the_default_to_spec_checks_json(monkeypatch, tmp_path):
    monkeypatch.setitem(DRAFTER_KINDS, "unsaveable", _Unsaveable)
    pool = DrafterPool([PromptLookupDrafter(), _Unsaveable()])
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'unsaveable' \(drafters\[1\]\) must have JSON-serialisable `config\(\)` parameters to be "
        r"saved, but has \{'table': <object .*>\}\. Return plain values from `_Unsaveable\.config\(\)`\.",
    ):
        pool.save_pretrained(tmp_path / "pool")
    assert not (tmp_path / "pool").exists()
