"""Reliability of what the user gives as words and numbers (docs/reliability.md, promise 12): a
switch is a switch, every refusal is one line, one fact has one source, every number is finite
and in range, and every range is bounded before it is expanded. One family of cases per class,
and each class through the real command line in a fresh process at least once."""

from __future__ import annotations

import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

import vitlab
from conftest import assert_one_line_error, tiny_model, vitlab_cli
from vitlab.cli import main
from vitlab.config import ConfigError, RunConfig
from vitlab.config.fields import SWITCHES, env_switch, switch
from vitlab.data import DataError, remote

FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def refused(capsys, argv, command, *mentions) -> str:
    return assert_one_line_error(main([str(a) for a in argv]), capsys.readouterr().err, command, mentions=mentions)


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), path)
    return path


# 1. Switches are switches ----------------------------------------------------------------------
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
NOT_SWITCHES = ("maybe", "2", "-1", "flase", "tru", "0.0", "y", "n", "enable", "disabled", "1 1", "nein")
ENV_SWITCHES = ("VITLAB_ALLOW_PIPE", "VITLAB_OFFLINE", "HF_HUB_OFFLINE")


@pytest.mark.parametrize("word", [w for words in (ON, OFF) for w in (words + tuple(x.upper() for x in words)
                                                                     + tuple(x.title() for x in words))])
def test_a_switch_takes_its_words_in_any_case(word):
    assert switch(word, "x") is (word.lower() in ON)
    assert switch(f" {word} ", "x") is (word.lower() in ON)


@pytest.mark.parametrize("word", NOT_SWITCHES)
@pytest.mark.parametrize("name", ENV_SWITCHES)
def test_an_environment_switch_refuses_any_other_word(monkeypatch, name, word):
    monkeypatch.setenv(name, word)
    with pytest.raises(ConfigError, match=f"^{name}=.*1/0, true/false, yes/no or on/off$"):
        env_switch(name)


@pytest.mark.parametrize("name", ENV_SWITCHES)
def test_an_environment_switch_unset_or_empty_is_off(monkeypatch, name):
    monkeypatch.delenv(name, raising=False)
    assert env_switch(name) is False
    monkeypatch.setenv(name, "  ")
    assert env_switch(name) is False


@FUZZ
@given(text=st.text(max_size=8))
def test_any_text_is_a_switch_word_or_refused(text):
    try:
        on = switch(text, "x")
    except ConfigError:
        assert text.strip().lower() not in SWITCHES
    else:
        assert SWITCHES[text.strip().lower()] is on


@pytest.mark.parametrize("word", OFF + tuple(w.upper() for w in OFF) + ("",))
def test_the_pipe_stays_off_unless_the_switch_is_on(monkeypatch, word):
    monkeypatch.setenv(remote.ALLOW_ENV, word)
    with remote.command_line_rule(["train"]):
        with pytest.raises(DataError, match="not on this command line"):
            remote.check_command("touch /nonexistent/x")


@pytest.mark.parametrize("word", ON + ("TRUE", "Yes", "ON"))
def test_the_pipe_runs_when_the_switch_is_on(monkeypatch, word):
    monkeypatch.setenv(remote.ALLOW_ENV, word)
    with remote.command_line_rule(["train"]):
        remote.check_command("echo allowed")


@pytest.mark.parametrize("word,on", [("OFF", False), ("Yes", True), ("0", False), ("1", True)])
def test_a_boolean_setting_takes_the_switch_words(word, on):
    assert RunConfig.from_dict({"data": {"hflip": word}}).data.hflip is on
    assert RunConfig.from_dict({"data": {"hflip": int(on)}}).data.hflip is on  # YAML's 1 and 0


@pytest.mark.parametrize("word", NOT_SWITCHES)
def test_a_boolean_setting_refuses_other_words(capsys, word):
    refused(capsys, ["train", f"data.hflip={word}", "--steps", "1"], "train", "data.hflip", "true/false, yes/no")


@pytest.mark.parametrize("word,runs", [("false", False), ("no", False), ("maybe", False), ("yes", True)])
def test_vitlab_allow_pipe_in_a_fresh_process(tmp_path, word, runs):
    """The issue's case: VITLAB_ALLOW_PIPE=false (or no) ran a recipe's shell command."""
    marker = tmp_path / "RAN"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": {"name": "ViT-C/4", "depth": 1, "hidden_size": 16, "num_heads": 2, "mlp_dim": 32},
        "data": {"name": f"wds:pipe:touch {marker}; false", "eval_data": "digits", "num_workers": 0},
        "train": {"steps": 1, "batch_size": 8}}))
    r = vitlab_cli("train", "--config", str(recipe), "--out", str(tmp_path / "run"), "--quiet",
                   env={remote.ALLOW_ENV: word})
    assert marker.exists() is runs, r.stderr[-2000:]
    if word == "maybe":
        assert_one_line_error(r.returncode, r.stderr, "train", mentions=(remote.ALLOW_ENV, "maybe", "yes/no"))
    elif not runs:
        assert_one_line_error(r.returncode, r.stderr, "train", mentions=("--allow-pipe", remote.ALLOW_ENV))
