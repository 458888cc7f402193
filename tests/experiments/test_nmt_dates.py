"""The nmt_dates task: config checks, decoded metrics, a user corpus, a tiny run end to end."""

import json
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from research import experiments
from research.data.text import EOS, Vocabulary
from research.errors import InputError
from research.experiments import nmt_dates
from research.training.config import ConfigError, apply_overrides
from research.training.loop import train_and_evaluate, validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import nmt_dates as experiment  # noqa: E402

TINY = {"data.train_examples": 512, "data.eval_examples": 64, "data.test_examples": 64,
        "model.embed_size": 16, "model.hidden_size": 32, "train.batch_size": 32,
        "train.num_steps": 40, "train.log_every": 10, "train.eval_every": 40,
        "train.checkpoint_every": 40, "train.warmup_steps": 0, "decode.beam_size": 2,
        "report.num_predictions": 5, "report.num_heatmaps": 2}


def tiny_config(arg=None, **overrides):
  return apply_overrides(experiment.get_config(arg), {**TINY, **overrides})


@pytest.mark.parametrize("arg, overrides, message", [
    ("attention=bahdanau_dot", {}, "config.model.attention='bahdanau_dot' is not allowed"),
    ("style=luong,cell=lstmx", {}, "config.model.kind='lstmx' is not allowed; choose one of: 'rnn'"),
    ("input_feeding=true", {}, "config.model.input_feeding=True needs config.model.style='luong'"),
    (None, {"data.locales": "fr,xx"}, "config.data.locales has unknown locales ['xx']"),
    (None, {"data.corpus": "/no/such.tsv"}, "config.data.corpus='/no/such.tsv' is not a file"),
    (None, {"model.hidden_size": 31}, "config.model.hidden_size=31 must be even"),
    (None, {"decode.beam_size": 0}, "config.decode.beam_size=0 must be a number > 0"),
])
def test_bad_values_are_named(arg, overrides, message):
  with pytest.raises(ConfigError) as error:
    validate(tiny_config(arg, **overrides), experiments.get("nmt_dates"))
  assert message in str(error.value)


def test_unknown_variant_argument_lists_the_allowed_ones():
  with pytest.raises(ConfigError, match="unknown variant 'cel'.*allowed: attention, cell"):
    experiment.get_config("cel=gru")


def test_decoded_metrics_count_tokens_up_to_eos_and_reject_trailing_output():
  batch = {"target_out": jnp.array([[5, 6, EOS, 0], [5, 6, EOS, 0], [7, EOS, 0, 0]]),
           "target_lengths": jnp.array([3, 3, 2])}
  tokens = jnp.array([[5, 6, EOS, 0], [5, 9, EOS, 0], [7, EOS, 8, 0]])
  metrics = nmt_dates.decoded_metrics(tokens, batch)
  np.testing.assert_allclose(metrics["token_accuracy"][0], [3, 2, 2])
  np.testing.assert_allclose(metrics["token_accuracy"][1], [3, 3, 2])
  # row 2 matches target + EOS but emits a token after its EOS position: not exact
  np.testing.assert_allclose(metrics["exact_match"][0], [1, 0, 0])


@pytest.mark.slow
def test_user_corpus_is_split_and_its_vocabulary_saved(tmp_path):
  lines = [f"{n} apples\t{n} pommes\textra column" for n in range(200)]
  corpus = tmp_path / "pairs.tsv"
  corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
  config = tiny_config(**{"data.corpus": str(corpus), "data.level": "word",
                          "train.num_steps": 10, "train.eval_every": 10,
                          "train.checkpoint_every": 10, "train.batch_size": 8})
  data = nmt_dates.load_data(config)
  sizes = {s: len(a["source"]) for s, a in data.splits.items()}
  assert sizes == {"train": 180, "validation": 10, "test": 10}
  assert data.source_vocab.tokens[4] == "apples"       # the most frequent word
  assert "extra" not in data.target_vocab.tokens
  saved = nmt_dates.run_files(data)     # what a run writes (a run restores from them: test_restore)
  assert Vocabulary.from_json(saved[nmt_dates.TARGET_VOCAB]).tokens == data.target_vocab.tokens


def test_a_corpus_too_small_for_its_splits_is_named(tmp_path):
  corpus = tmp_path / "few.tsv"
  corpus.write_text("a\tb\n" * 40, encoding="utf-8")
  with pytest.raises(InputError, match=r"few\.tsv: its 40 pairs split into train 36, "
                                       r"validation 2, test 2; .* config.train.batch_size=128"):
    nmt_dates.load_data(tiny_config(**{"data.corpus": str(corpus), "train.batch_size": 128}))


@pytest.mark.slow
def test_tiny_run_lowers_the_loss_and_writes_predictions_and_heatmaps(tmp_path):
  final = train_and_evaluate(tiny_config(), str(tmp_path), experiments.get("nmt_dates"))
  with open(tmp_path / "metrics.jsonl") as f:
    losses = [r["train/loss"] for r in map(json.loads, f) if "train/loss" in r]
  assert losses[-1] < 0.8 * losses[0]
  for method in ("greedy", "beam"):
    assert 0 <= final[f"test/exact_match_{method}"] <= final[f"test/token_accuracy_{method}"]
  header, *rows = (tmp_path / "predictions.tsv").read_text(encoding="utf-8").splitlines()
  assert header.split("\t") == ["source", "target", "greedy", "beam", "locale"] and len(rows) == 5
  assert all(len(row.split("\t")[1]) == 10 for row in rows)      # ISO targets
  pngs = [n for n in os.listdir(tmp_path) if n.startswith("attention_") and n.endswith(".png")]
  assert len(pngs) == 2
