"""`vitlab models [PATTERN] [--pretrained]`: the names vitlab.list_models gives, on the command line."""

from __future__ import annotations

import json

import vitlab
from vitlab.cli import main


def test_pretrained_names_by_pattern_match_python(capsys):
    assert main(["models", "ViT-B*", "--pretrained", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == vitlab.list_models("ViT-B*", pretrained=True)
    first = rows[0]
    assert (first["name"], first["classes"], first["resolution"]) == ("ViT-B/16:imagenet21k", 21843, 224)
    assert main(["models", "vit-s/16:*", "--pretrained"]) == 0  # any case, as in Python
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(vitlab.list_models("ViT-S/16:*", pretrained=True)) and "ImageNet-21k" in lines[1]


def test_a_pattern_filters_the_variants_and_no_match_is_an_error(capsys):
    assert main(["models", "BiT-R50*", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == vitlab.list_models("BiT-R50*")
    assert main(["models", "ViT-Z*", "--pretrained"]) != 0
    err = capsys.readouterr().err
    assert "no published checkpoint matches 'ViT-Z*'" in err and len(err.splitlines()) == 1
