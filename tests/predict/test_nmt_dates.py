"""research.predict.nmt_dates on a tiny nmt_dates run (2 steps): restored translations equal
the loop's own, greedy tokens the argmax of the model's teacher-forced logits, attention
rows distributions over the source, beam search of one hypothesis greedy decoding (its
teacher-forced attention greedy decoding's own), beam scores GNMT's formula, the refusals;
batches as one batch, any iterable of texts read once, attention refused beyond RESULT_BYTES."""

import dataclasses
import functools
import json

import jax
import numpy as np
import pytest

from research import experiments
from research.data import dates
from research.data.text import BOS, EOS, SPECIAL_TOKENS, Vocabulary
from research.errors import InputError
from research.predict import nmt_dates as predictor
from research.predict import runs as rules
from research.predict.nmt_dates import _beam_search, translate
from research.training import Run

from . import trained

pytestmark = pytest.mark.xdist_group("predict_nmt_dates")   # one worker: its trained fixtures run once

LOCALES = ("fr", "en", "zh")
TINY = {"data.train_examples": 32, "data.eval_examples": 16, "data.test_examples": 16,
        "data.locales": ",".join(LOCALES), "model.kind": "rnn", "model.bidirectional": False,
        "model.embed_size": 8, "model.hidden_size": 16,
        "train.batch_size": 16, "train.num_steps": 2, "train.warmup_steps": 0,
        "train.log_every": 1, "train.eval_every": 2, "train.checkpoint_every": 2}


def tiny_config():
  return trained.config("nmt_dates", None, TINY)


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def runs(tmp_path_factory):
  """(restored run, the same with the parameters the loop ended with, three of its training
  sources: texts inside its vocabulary)."""
  config = tiny_config()
  run, final = trained.restored_and_final(config, str(tmp_path_factory.mktemp("nmt") / "run"),
                                          report=False)
  texts = [r.source for r in dates.date_records("train", 3, config.seed, LOCALES)]
  return run, final, texts


@functools.partial(jax.jit, static_argnums=0)
def forward(model, params, source, source_lengths, target_in):
  """The model's __call__ (teacher forcing): logits [N, T, V], weights [N, T, S]."""
  return model.apply({"params": params}, source, source_lengths, target_in)


def teacher_forced(run, texts, output_tokens):
  """The model's __call__ over BOS + each output's tokens, its source padded to the run's
  longest: (log-softmax [N, T + 1, V], weights [N, T + 1, S], output ids [N, T + 1])."""
  vocab, target_vocab = run.extras["source_vocab"], run.extras["target_vocab"]
  steps = run.extras["max_target_length"] + 1
  source = np.zeros((len(texts), run.extras["max_source_length"]), np.int32)
  outputs = np.zeros((len(texts), steps), np.int32)
  for row, (text, tokens) in enumerate(zip(texts, output_tokens)):
    source[row, :len(text)] = [vocab.ids[c] for c in text]
    outputs[row, :len(tokens)] = [target_vocab.ids[t] for t in tokens]
  target_in = np.concatenate([np.full((len(texts), 1), BOS), outputs[:, :-1]], axis=1)
  logits, weights = forward(run.model, run.params, source, np.array([len(t) for t in texts]),
                            target_in)
  return np.asarray(jax.nn.log_softmax(logits)), np.asarray(weights), outputs


@pytest.mark.slow
def test_a_restored_run_translates_as_the_loop_ended_greedily_and_by_beam_search(runs):
  run, final, texts = runs
  for beam_size in (1, 2):
    result = translate(run, texts, beam_size=beam_size)
    trained.assert_bitwise_equal(result, translate(final, texts, beam_size=beam_size))
    assert result.texts == texts and result.source_tokens == [list(t) for t in texts]
    assert (result.scores is None) == (beam_size == 1)
    for output, tokens, weights, text in zip(result.outputs, result.output_tokens,
                                             result.attention, texts):
      ended = tokens[-1:] == ["<eos>"]
      assert len(tokens) <= run.extras["max_target_length"] + 1
      assert ended or len(tokens) == run.extras["max_target_length"] + 1
      assert output == "".join(t for t in (tokens[:-1] if ended else tokens)
                               if t not in ("<pad>", "<bos>"))       # as Vocabulary.decode
      assert weights.shape == (len(tokens), len(text)) and weights.dtype == np.float32
      np.testing.assert_allclose(weights.sum(1), 1.0, rtol=1e-5)     # additive: softmax


@pytest.mark.slow
def test_greedy_tokens_are_the_argmax_of_the_teacher_forced_logits(runs):
  run, _, texts = runs
  result = translate(run, texts)
  log_p, weights, outputs = teacher_forced(run, texts, result.output_tokens)
  for row, tokens in enumerate(result.output_tokens):
    steps = len(tokens)
    np.testing.assert_array_equal(log_p[row, :steps].argmax(-1), outputs[row, :steps])
    np.testing.assert_allclose(result.attention[row], weights[row, :steps, :len(texts[row])],
                               rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_beam_search_of_one_hypothesis_is_greedy_and_its_teacher_forced_attention_too(runs):
  """Beam search's attention (the teacher-forced pass over its tokens, `_beam_search`) equals
  greedy decoding's own weights where both decode the same tokens: K = 1, α = 0."""
  run, _, texts = runs
  greedy = translate(run, texts)
  ids = np.zeros((len(texts), run.extras["max_source_length"]), np.int32)
  for row, text in enumerate(texts):
    ids[row, :len(text)] = run.extras["source_vocab"].encode(list(text))
  tokens, _, weights = _beam_search(run.model, run.params, ids, np.array(list(map(len, texts))),
                                    beam_size=1, max_len=run.extras["max_target_length"] + 1,
                                    length_penalty=0.0)
  for row, output in enumerate(greedy.output_tokens):
    ids = [run.extras["target_vocab"].ids[t] for t in output]
    np.testing.assert_array_equal(np.asarray(tokens)[row, :len(ids)], ids)
    assert not np.asarray(tokens)[row, len(ids):].any()
    np.testing.assert_allclose(np.asarray(weights)[row, :len(ids), :len(texts[row])],
                               greedy.attention[row], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_beam_scores_are_log_p_over_gnmt_length_penalty(runs):
  run, _, texts = runs
  result = translate(run, texts, beam_size=2, length_penalty=0.6)
  log_p, _, outputs = teacher_forced(run, texts, result.output_tokens)
  for row, tokens in enumerate(result.output_tokens):
    total = log_p[row, np.arange(len(tokens)), outputs[row, :len(tokens)]].sum()
    penalty = ((5 + len(tokens)) / 6) ** 0.6                       # Wu et al. 2016, eq. 14
    assert result.scores[row] == pytest.approx(total / penalty, rel=1e-5)


@pytest.mark.slow
def test_an_output_ends_at_its_eos(runs):
  """EOS's logit raised far above the others: every output is EOS alone, the empty string,
  with one attention row; beam search scores it log p(EOS) / lp(1) = log p(EOS) ≈ 0."""
  run, _, texts = runs
  raise_eos = lambda path, x: (x.at[EOS].add(1e3) if jax.tree_util.keystr(path)
                               == "['decoder']['output']['bias']" else x)
  run = dataclasses.replace(run, params=jax.tree_util.tree_map_with_path(raise_eos, run.params))
  for beam_size in (1, 2):
    result = translate(run, texts, beam_size=beam_size)
    assert result.outputs == [""] * 3 and result.output_tokens == [["<eos>"]] * 3
    assert [a.shape for a in result.attention] == [(1, len(text)) for text in texts]
    np.testing.assert_allclose([a.sum() for a in result.attention], 1.0, rtol=1e-5)
  np.testing.assert_allclose(result.scores, 0.0, atol=1e-6)


# ---- Refusals, on a run built without data or parameters ------------------------------------

VOCABULARY = Vocabulary((*SPECIAL_TOKENS, *"0123456789 janvier"))
FILES = {"source_vocab.json": VOCABULARY.to_json(), "target_vocab.json": VOCABULARY.to_json(),
         "lengths.json": json.dumps({"max_source_length": 16, "max_target_length": 10})}


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def untrained():
  """An nmt_dates Run of the tiny config over FILES, neither trained nor written."""
  config = tiny_config()
  experiment = experiments.get("nmt_dates")
  model, _, extras = experiment.build_model(config, FILES.__getitem__)
  return Run("(untrained)", 0, (0,), config, experiment, model, None, extras, [], [])


@pytest.mark.parametrize("texts, options, message", [
    ([], {}, "no texts to translate: give a list of at least one text"),
    ("14 janvier", {}, "texts must be a list of texts, got one string '14 janvier': give "
                       "[text]"),
    (["14 janvier", 14], {}, "texts[1] is a int, not a str"),
    (["14 janvier", ""], {}, "texts[1] has no character to translate: ''"),
    (["14 janvier", "14 Janvier 2024!"], {},
     "texts[1] '14 Janvier 2024!' has characters outside the run's source vocabulary: '!', "
     "'J'; it knows 18 characters: '0123456789 jan"),
    (["1 janvier 2024 2025"], {}, "texts[0] '1 janvier 2024 2025' is 19 characters long; the "
                                  "run's model takes at most 16 (the longest source of its "
                                  "data)"),
    *[(["14 janvier"], {"beam_size": size}, f"beam_size={size!r} must be an int in 1 … 22 (1: "
                                            "greedy decoding; at most the target vocabulary's "
                                            "size)")
      for size in (0, -1, 2.0, True, "2", None, 23, 10**9, 2**63, 2**64)],
    (b"14 janvier", {}, "texts must be a list of texts, got one bytes b'14 janvier': give "
                        "[text]"),
    (14, {}, "texts must be a list of texts, got a int, which is not iterable"),
    ((t for t in ["14 janvier", 14]), {}, "texts[1] is a int, not a str"),
    (np.array([["14 janvier"]]), {}, "texts[0] is a ndarray, not a str"),
    (["14 janvier"], {"attention": None}, "attention=None must be True or False"),
    (["14 janvier"], {"beam_size": 2, "length_penalty": -0.5},
     r"length_penalty=-0.5 must be a number in [0, 10] (GNMT's α is 0.6–1; 0: rank by log P "
     "alone)"),
])
def test_input_the_model_cannot_take_is_refused_naming_it(untrained, texts, options, message):
  with pytest.raises(InputError) as raised:
    translate(untrained, texts, **options)
  assert str(raised.value).startswith(message), raised.value


def test_a_run_of_another_experiment_is_refused(untrained):
  config = untrained.config.copy_and_resolve_references()
  config.experiment = "char_lm"
  with pytest.raises(InputError, match=r"^translate answers nmt_dates runs; the run in "
                                       r"\(untrained\) is a char_lm run$"):
    translate(dataclasses.replace(untrained, config=config), ["14 janvier"])


def test_word_level_runs_name_the_words_they_do_not_know(untrained):
  words = Vocabulary((*SPECIAL_TOKENS, "le", "14", "janvier"))
  run = dataclasses.replace(untrained, extras={**untrained.extras, "source_vocab": words,
                                               "level": "word"})
  with pytest.raises(InputError, match=r"^texts\[0\] 'le 14 Janvier' has words outside the "
                                       r"run's source vocabulary: 'Janvier'; it knows 3 words: "
                                       r"run.extras\['source_vocab'\].tokens$"):
    translate(run, ["le 14 Janvier"])
  with pytest.raises(InputError, match=r"^texts\[0\] has no word to translate: ' '$"):
    translate(run, [" "])


# ---- Bounded memory: batches of one shape, texts read once, attention refused beyond the bound

@pytest.fixture(scope="session")
def initialised(untrained):
  """The untrained run over FILES with its model's initial parameters (train.batch_size 16)."""
  model, init, _ = experiments.get("nmt_dates").build_model(untrained.config, FILES.__getitem__)
  return dataclasses.replace(untrained, params=jax.jit(init)(jax.random.key(0)))


TEXTS = ["14 janvier 2024", "1 janvier 1999", "30 janvier 20", "9 janvier", "2024 1 14"]




@pytest.mark.slow
def test_texts_in_batches_translate_as_in_one_batch(initialised, monkeypatch):
  """5 texts in one call, then in 3 calls of 2 (MAX_ROWS forced, the last padded): the same
  outputs, tokens, attention and beam scores, greedily and with a beam of 3."""
  calls = trained.recording(monkeypatch, predictor, "_decode", lambda source, options: (source.shape[0], options["beam_size"]))
  for beam_size in (1, 3):
    whole = translate(initialised, TEXTS, beam_size=beam_size)
    monkeypatch.setattr(rules, "MAX_ROWS", 2)
    batched = translate(initialised, TEXTS, beam_size=beam_size)
    monkeypatch.setattr(rules, "MAX_ROWS", 4096)
    assert calls == [(5, beam_size), (2, beam_size), (2, beam_size), (2, beam_size)]
    calls.clear()
    assert (batched.texts, batched.outputs, batched.output_tokens, batched.source_tokens) == (
        whole.texts, whole.outputs, whole.output_tokens, whole.source_tokens)
    for got, expected in zip(batched.attention, whole.attention, strict=True):
      np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    if beam_size > 1:
      np.testing.assert_allclose(batched.scores, whole.scores, rtol=1e-6)
    plain = translate(initialised, TEXTS, beam_size=beam_size, attention=False)
    assert plain.attention is None and plain.outputs == whole.outputs
    calls.clear()


@pytest.mark.slow
def test_any_iterable_of_texts_is_read_once_and_named_beside_its_output(initialised):
  """A generator used to be read twice (texts == [] beside the outputs): its texts, a tuple's
  and a numpy array's are those of the list, beside the same outputs."""
  reference = translate(initialised, TEXTS)
  for given in ((t for t in TEXTS), tuple(TEXTS), np.array(TEXTS), iter(TEXTS)):
    result = translate(initialised, given)
    assert result.texts == TEXTS and len(result.outputs) == len(TEXTS)
    assert result.outputs == reference.outputs


def test_attention_beyond_the_bound_is_refused_before_anything_runs(initialised, monkeypatch):
  """[11, 16] float32 weights a text (T + 1 = 11 steps, S = 16): refused beyond RESULT_BYTES,
  naming attention=True; attention=False translates them."""
  calls = trained.recording(monkeypatch, predictor, "_decode", lambda source, options: (source.shape[0], options["beam_size"]))
  per_text = 11 * 16 * 4
  monkeypatch.setattr(rules, "RESULT_BYTES", 4 * per_text)
  with pytest.raises(InputError) as raised:
    translate(initialised, TEXTS)
  assert str(raised.value) == (
      f"attention=True: the attention weights [11, 16] a text of 5 inputs take {5 * per_text:,} "
      f"bytes, more than a prediction returns at once (research.predict.runs.RESULT_BYTES = "
      f"{4 * per_text:,}): pass attention=False, or fewer texts at once")
  assert calls == []
  assert len(translate(initialised, TEXTS, attention=False).outputs) == 5
