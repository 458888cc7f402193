"""The nmt_dates experiment: seq2seq with attention from dates in many locales to ISO.

`Seq2Seq(**config.model, <vocabulary sizes and source length from the data>)` learns from
dates rendered by babel from CLDR (research/data/dates.py), or from the user's own
`source<TAB>target` file (config.data.corpus), by the cross-entropy of its teacher-forced
logits; the final report decodes the test split greedily and with beam search.
"""

import json
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from research.attention import SCORE_FUNCTIONS, reinforce_surrogate
from research.data import dates
from research.data.stream import ShuffledStream, eval_batches
from research.data.text import (
  BOS,
  EOS,
  LEVELS,
  PAD,
  UNK,
  Vocabulary,
  detokenize,
  encode_pairs,
  parallel_corpus_pairs,
  tokenize,
  warn_skipped,
)
from research.errors import ConfigError, InputError
from research.models.decoding import beam_search, greedy_decode
from research.models.remat import REMAT
from research.models.seq2seq import CELLS, DECODER_ATTENTIONS, HARD_TRAINING, STYLES, Seq2Seq
from research.training.config import (
  COMPUTE_DTYPES,
  check_choice,
  check_host_memory,
  check_parameter_memory,
  check_positive,
  check_range,
  check_rate,
)
from research.training.experiment import Heatmap, Inference, Model, Report, Workload, register

# Host bytes per generated date while the data is made (measured: 3.6 kB at the peak).
DATE_BYTES = 4096
CORPUS_BYTES = 32                  # host bytes per byte of a corpus, read as tokens
LENGTH_BUCKETS = (0, 10, 20, 30, 1000)        # source tokens: [0, 10), [10, 20), ...
CORPUS_SPLITS = {"train": 0.9, "validation": 0.05, "test": 0.05}
HEATMAP_LOCALES = ("ru", "el", "ar", "fr", "de", "uk")   # scripts DejaVu Sans can draw
SOURCE_VOCAB, TARGET_VOCAB, LENGTHS = "source_vocab.json", "target_vocab.json", "lengths.json"


def validate(config) -> None:
  m, d = config.model, config.data
  check_choice(config, "model.kind", CELLS)
  check_choice(config, "model.attention", DECODER_ATTENTIONS)
  check_choice(config, "model.style", STYLES)
  check_choice(config, "model.score", SCORE_FUNCTIONS)
  check_choice(config, "model.hard_training", HARD_TRAINING)
  check_choice(config, "model.dtype", COMPUTE_DTYPES)
  if "remat" in m:        # absent from the config.json of a run before it: "none"
    check_choice(config, "model.remat", REMAT)
  check_choice(config, "data.level", LEVELS)
  check_positive(config, "model.embed_size", "model.hidden_size", "model.encoder_layers",
                 "model.window", "data.train_examples", "data.eval_examples",
                 "data.test_examples", "data.max_length", "decode.beam_size")
  if not d.corpus and d.train_examples < config.train.batch_size:
    raise ConfigError(f"config.data.train_examples={d.train_examples} must be at least "
                      f"config.train.batch_size={config.train.batch_size}")
  check_positive(config, "report.num_predictions", "report.num_heatmaps", allow_zero=True)
  check_range(config, "decode.length_penalty", 0, 10, "GNMT's α is 0.6–1; a larger one "
              "overflows the penalty of long hypotheses")
  check_rate(config, "model.dropout_rate")
  if m.bidirectional and m.hidden_size % 2:
    raise ConfigError(f"config.model.hidden_size={m.hidden_size} must be even with "
                      "config.model.bidirectional=True (hidden_size / 2 per direction)")
  if m.input_feeding and m.style == "bahdanau":
    raise ConfigError("config.model.input_feeding=True needs config.model.style='luong' "
                      "(Bahdanau feeds the context c_t already); allowed with 'bahdanau': False")
  # a layer of LSTM gates 8 h (h + e) per direction at most, the decoder and attention alike
  check_parameter_memory(config, ("model.encoder_layers", "model.hidden_size",
                                  "model.embed_size"),
                         (m.encoder_layers + 2) * 16 * m.hidden_size * (m.hidden_size
                                                                       + m.embed_size))
  if d.corpus and not os.path.isfile(d.corpus):
    raise ConfigError(f"config.data.corpus={d.corpus!r} is not a file; give a "
                      "source<TAB>target file, or '' for the generated dates")
  if d.corpus:                      # Python's token lists: measured 15–20 bytes per byte
    size = os.path.getsize(d.corpus)
    check_host_memory(config, ("data.corpus",), CORPUS_BYTES * size,
                      f"the tokens of its {size} bytes")
  unknown = set(_locales(config)) - set(dates.LOCALES)
  if unknown:
    raise ConfigError(f"config.data.locales has unknown locales {sorted(unknown)}; allowed: "
                      f"'all' or a comma-separated subset of {', '.join(dates.LOCALES)}")
  if not d.corpus:                  # (a batch of the evaluation is padded to a whole one)
    examples = d.train_examples + d.eval_examples + d.test_examples + config.train.batch_size
    check_host_memory(config, ("data.train_examples", "data.eval_examples", "data.test_examples",
                               "train.batch_size"), examples * DATE_BYTES,
                      f"{examples} generated dates")


class Data(NamedTuple):
  splits: dict[str, dict[str, np.ndarray]]     # split -> encode_pairs arrays
  groups: dict[str, list[str]]                 # split -> locale of each example ('' corpus)
  source_vocab: Vocabulary
  target_vocab: Vocabulary
  level: str
  skipped: int = 0                             # corpus pairs left out for their length


def _locales(config) -> tuple[str, ...]:
  text = config.data.locales
  return dates.LOCALES if text == "all" else tuple(x.strip() for x in text.split(","))


def level(config) -> str:
  """How text is tokenized: "char" for the dates, config.data.level for a corpus."""
  return config.data.level if config.data.corpus else "char"


def load_data(config) -> Data:
  """The splits, encoded, and their vocabularies.

  With config.data.corpus empty, dates rendered by babel from CLDR (research/data/dates.py;
  splits disjoint by date); otherwise the user's own `source<TAB>target` file, shuffled with
  the seed and split 90/5/5, leaving out (with a warning that counts them, in `build`) pairs
  longer than config.data.max_length tokens. Tokens are characters (dates) or
  config.data.level. Vocabularies come from the training split; they and the longest source
  and target are written into the workdir (`run_files`), from which `build_model` makes the
  model again.
  """
  d = config.data
  sizes = {"train": d.train_examples, "validation": d.eval_examples, "test": d.test_examples}
  if d.corpus:
    pairs, skipped = parallel_corpus_pairs(d.corpus, d.level, d.max_length)
    order = np.random.default_rng(config.seed).permutation(len(pairs))
    fractions = list(CORPUS_SPLITS.values())[:-1]      # the last split takes the rest
    parts = np.split(order, np.cumsum([int(f * len(pairs)) for f in fractions]))
    tokens = {s: [pairs[i] for i in part] for s, part in zip(CORPUS_SPLITS, parts, strict=True)}
    groups = {s: [""] * len(t) for s, t in tokens.items()}
    _check_corpus_splits(config, {s: len(t) for s, t in tokens.items()}, skipped)
  else:
    tokens, groups = {}, {}
    for split, size in sizes.items():
      records = dates.date_records(split, size, config.seed, _locales(config))
      tokens[split] = [(tokenize(r.source, "char"), tokenize(r.target, "char")) for r in records]
      groups[split] = [r.locale for r in records]
  source_vocab = Vocabulary.build(s for s, _ in tokens["train"])
  target_vocab = Vocabulary.build(t for _, t in tokens["train"])
  longest_source = max(len(s) for pairs in tokens.values() for s, _ in pairs)
  longest_target = max(len(t) for pairs in tokens.values() for _, t in pairs)
  if d.corpus:        # int32 source, target_in and target_out, the evaluation's copies
    examples = sum(map(len, tokens.values())) + config.train.batch_size
    check_host_memory(config, ("data.corpus", "data.max_length", "train.batch_size"),
                      2 * 4 * examples * (longest_source + 2 * longest_target + 2),
                      f"the {examples} pairs of up to {longest_source} and {longest_target} "
                      "tokens padded to the longest")
  splits = {s: encode_pairs(p, source_vocab, target_vocab, longest_source, longest_target)
            for s, p in tokens.items()}
  return Data(splits, groups, source_vocab, target_vocab, level(config),
              skipped if d.corpus else 0)


def _check_corpus_splits(config, sizes: dict[str, int], skipped: int) -> None:
  """Every split of a user's corpus non-empty, and a training split of a whole batch."""
  counts = ", ".join(f"{split} {size}" for split, size in sizes.items())
  batch_size = config.train.batch_size
  if min(sizes.values()) == 0 or sizes["train"] < batch_size:
    left_out = (f" ({skipped} more left out, longer than config.data.max_length="
                f"{config.data.max_length} tokens)" if skipped else "")
    raise InputError(f"{config.data.corpus}: its {sum(sizes.values())} pairs{left_out} split "
                     f"into {counts}; every split needs a pair and training at least "
                     f"config.train.batch_size={batch_size}: give a larger corpus or a smaller "
                     "batch")


def run_files(data: Data) -> dict[str, str]:
  """What a run writes into its workdir for `build_model`: the vocabularies and the longest
  source and target of every split (tokens; the arrays are padded to them)."""
  lengths = {"max_source_length": data.splits["train"]["source"].shape[1],
             "max_target_length": data.splits["train"]["target_out"].shape[1] - 1}
  return {SOURCE_VOCAB: data.source_vocab.to_json(), TARGET_VOCAB: data.target_vocab.to_json(),
          LENGTHS: json.dumps(lengths) + "\n"}


def build_model(config, read) -> Model:
  """config.model's Seq2Seq with the run's vocabularies and longest source S (the files of
  `run_files`: read(name)), initialised on one pair of the longest lengths; config.model's
  keys are Seq2Seq's fields.

  extras: source_vocab and target_vocab (Vocabulary), level (tokenize's level),
  max_source_length S and max_target_length T (tokens): the model takes sources of up to
  S tokens, and decoding runs T + 1 steps (the target and EOS).
  """
  source_vocab = Vocabulary.from_json(read(SOURCE_VOCAB))
  target_vocab = Vocabulary.from_json(read(TARGET_VOCAB))
  lengths = json.loads(read(LENGTHS))
  source_length, target_length = lengths["max_source_length"], lengths["max_target_length"]
  model = Seq2Seq(**config.model, source_vocab_size=source_vocab.size,
                  target_vocab_size=target_vocab.size, max_source_length=source_length)

  def init(rng):
    return model.init(rng, jnp.ones((1, source_length), jnp.int32),
                      jnp.full((1,), source_length, jnp.int32),
                      jnp.ones((1, target_length + 1), jnp.int32))["params"]

  return Model(model, init, {"source_vocab": source_vocab, "target_vocab": target_vocab,
                             "level": level(config), "max_source_length": source_length,
                             "max_target_length": target_length})


def inference(config, model, extras) -> Inference:
  """Greedy decoding (`greedy_decode`) of sources [B, S]: the output tokens [B, T + 1] and the
  attention weights [B, T + 1, S] of each step; `about` has what encoding a source and
  reading the tokens take (the vocabularies, the tokenization level, the special ids)."""
  del config     # the model holds it
  source_length, steps = extras["max_source_length"], extras["max_target_length"] + 1

  def function(params, source, source_lengths):
    tokens, attention = greedy_decode(model, params, source, source_lengths, bos_id=BOS,
                                      eos_id=EOS, max_len=steps)
    return {"tokens": tokens, "attention": attention}

  level = extras["level"]
  unit = "character" if level == "char" else "whitespace-separated word"
  return Inference(
      function,
      {"source": (jax.ShapeDtypeStruct((1, source_length), jnp.int32),
                  f"each source's tokens (one per {unit}) as ids of source_vocabulary (its "
                  f"index; {UNK} for a token not in it), padded with {PAD} to {source_length}"),
       "source_lengths": (jax.ShapeDtypeStruct((1,), jnp.int32),
                          f"the number of tokens of each source, 1 … {source_length}")},
      {"tokens": "the ids of target_vocabulary decoded greedily, up to and "
                 f"including EOS ({EOS}), then {PAD}",
       "attention": "the attention weights over the source tokens at each output step (0 "
                    "after EOS)"},
      {"level": level, "source_vocabulary": extras["source_vocab"].tokens,
       "target_vocabulary": extras["target_vocab"].tokens,
       "special_ids": {"pad": PAD, "bos": BOS, "eos": EOS, "unk": UNK},
       "detokenize": "join the target tokens before EOS " + (
           "with nothing between them" if level == "char" else "with single spaces")})


def target_mask(batch):
  """[B, T+1] True on each target's tokens and its EOS."""
  return jnp.arange(batch["target_out"].shape[1]) < batch["target_lengths"][:, None]


def token_losses(logits, batch):
  """Cross-entropy and correctness [B, T+1] of teacher-forced logits, and the target mask."""
  targets, mask = batch["target_out"], target_mask(batch)
  cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  correct = jnp.argmax(logits, -1) == targets
  return cross_entropy * mask, correct & mask, mask


def decoded_metrics(tokens, batch) -> dict[str, tuple]:
  """Token accuracy and exact match of decoded tokens [B, T+1] against target + EOS."""
  targets, mask = batch["target_out"], target_mask(batch)
  tokens = tokens[:, :targets.shape[1]]
  count = mask.sum(1).astype(jnp.float32)
  correct = ((tokens == targets) & mask).sum(1).astype(jnp.float32)
  exact = jnp.all(tokens == targets, axis=1)    # targets are 0 (padding) after EOS, as decoded
  return {"token_accuracy": (correct, count),
          "exact_match": (exact.astype(jnp.float32), jnp.ones_like(count))}


def check_beam_memory(config, data: Data) -> None:
  """Beam search (the report) keeps config.decode.beam_size copies of each batch row's
  encoder memory, state and hypotheses, and scores beam_size × vocabulary candidates."""
  source_length = data.splits["train"]["source"].shape[1]
  target_length = data.splits["train"]["target_out"].shape[1]
  rows = config.train.batch_size * config.decode.beam_size
  per_row = (2 * source_length * config.model.hidden_size + 4 * config.model.hidden_size
             + 3 * data.target_vocab.size + 2 * target_length)
  check_host_memory(config, ("decode.beam_size", "train.batch_size", "model.hidden_size"),
                    4 * rows * per_row, f"beam search's {rows} hypotheses (float32)")


def build(config) -> Workload:
  """Model, data and loss for config (validated); see research/training/experiment.py.

  Training minimises the cross-entropy of teacher-forced logits over the target tokens
  (target + EOS). Periodic evaluation on the validation split reports the loss, token
  accuracy (teacher forced) and greedy exact match; the final report is `test_report`.
  """
  data = load_data(config)
  check_beam_memory(config, data)
  if config.data.corpus:            # the corpus is accepted: say what was left out
    total = sum(len(split["source"]) for split in data.splits.values()) + data.skipped
    warn_skipped(config.data.corpus, data.skipped, total, data.level, config.data.max_length)
  files = run_files(data)
  model, init, extras = build_model(config, files.__getitem__)
  max_len = extras["max_target_length"] + 1          # decoding steps: the target and EOS
  reinforce = config.model.attention == "hard" and config.model.hard_training == "reinforce"

  def loss(params, batch, rng):
    dropout_rng, attention_rng = jax.random.split(rng)
    (logits, _), state = model.apply(
        {"params": params}, batch["source"], batch["source_lengths"], batch["target_in"],
        train=True, rngs={"dropout": dropout_rng, "attention": attention_rng},
        mutable=["intermediates"])
    cross_entropy, correct, mask = token_losses(logits, batch)
    total = cross_entropy.sum() / mask.sum()
    metrics = {"token_accuracy": correct.sum() / mask.sum()}
    if reinforce:     # REINFORCE for the sampled positions, reward −NLL, batch-mean baseline
      log_prob = state["intermediates"]["decoder"]["attention_log_prob"][0]
      log_prob = (log_prob * mask).sum(1)
      reward = -cross_entropy.sum(1)
      total = total - reinforce_surrogate(log_prob, reward, reward.mean())
    return total, metrics

  def evaluate(params, batch):
    logits, _ = model.apply({"params": params}, batch["source"], batch["source_lengths"],
                            batch["target_in"])
    cross_entropy, correct, mask = token_losses(logits, batch)
    count = mask.sum(1).astype(jnp.float32)
    tokens, _ = greedy_decode(model, params, batch["source"], batch["source_lengths"],
                              bos_id=BOS, eos_id=EOS, max_len=max_len)
    return {"loss": (cross_entropy.sum(1), count),
            "teacher_forced_accuracy": (correct.sum(1).astype(jnp.float32), count),
            "exact_match": decoded_metrics(tokens, batch)["exact_match"]}

  def report(params) -> Report:
    return test_report(config, model, params, data, max_len)

  return Workload(init=init,
              train_data=ShuffledStream(data.splits["train"], config.train.batch_size,
                                        config.seed),
              eval_data=eval_batches(data.splits["validation"], config.train.batch_size),
              loss=loss, evaluate=evaluate, report=report, files=files,
              loss_weight=lambda batch: target_mask(batch).sum())


def test_report(config, model, params, data: Data, max_len: int) -> Report:
  """Greedy and beam decoding of the test split: token accuracy, exact match, exact match by
  source length bucket, sample predictions (predictions.tsv) and attention heatmaps."""
  test, groups = data.splits["test"], data.groups["test"]
  decoded = {"greedy": [], "beam": [], "weights": []}
  for batch in eval_batches(test, config.train.batch_size):
    args = (model, params, jnp.asarray(batch["source"]), jnp.asarray(batch["source_lengths"]))
    tokens, weights = greedy_decode(*args, bos_id=BOS, eos_id=EOS, max_len=max_len)
    beam, _ = beam_search(*args, beam_size=config.decode.beam_size, bos_id=BOS, eos_id=EOS,
                          max_len=max_len, length_penalty=config.decode.length_penalty)
    real = batch["weight"] > 0
    decoded["greedy"].append(np.asarray(tokens)[real])
    decoded["beam"].append(np.asarray(beam)[real])
    decoded["weights"].append(np.asarray(weights)[real])
  decoded = {k: np.concatenate(v) for k, v in decoded.items()}

  metrics = {}
  lengths = test["source_lengths"]
  for method in ("greedy", "beam"):
    per_example = jax.device_get(decoded_metrics(jnp.asarray(decoded[method]), test))
    for name, (num, den) in per_example.items():
      metrics[f"test/{name}_{method}"] = float(num.sum() / den.sum())
    exact = per_example["exact_match"][0]
    for lo, hi in zip(LENGTH_BUCKETS[:-1], LENGTH_BUCKETS[1:]):
      inside = (lengths >= lo) & (lengths < hi)
      if inside.any():
        metrics[f"test/exact_match_{method}_len_{lo}-{hi - 1}"] = float(exact[inside].mean())

  text = lambda vocab, ids: detokenize(vocab.decode(ids), data.level)
  rows = ["source\ttarget\tgreedy\tbeam\tlocale"]
  for n in range(min(config.report.num_predictions, len(lengths))):
    rows.append("\t".join([text(data.source_vocab, test["source"][n]),
                           text(data.target_vocab, test["target_out"][n]),
                           text(data.target_vocab, decoded["greedy"][n]),
                           text(data.target_vocab, decoded["beam"][n]), groups[n]]))

  heatmaps = {}
  for n in _heatmap_examples(groups, config.report.num_heatmaps):
    source = data.source_vocab.decode(test["source"][n][:lengths[n]])
    ids = decoded["greedy"][n].tolist()
    output = [data.target_vocab.tokens[i] for i in ids[:ids.index(EOS) + 1 if EOS in ids else None]]
    heatmaps[f"attention_{n}_{groups[n] or 'corpus'}"] = Heatmap(
        decoded["weights"][n][:len(output), :len(source)], output, source,
        title=f"{''.join(source)} → {text(data.target_vocab, ids)}")
  return Report(metrics, heatmaps, {"predictions.tsv": "\n".join(rows) + "\n"})


def _heatmap_examples(groups: list[str], count: int) -> list[int]:
  """The first test example of each locale in HEATMAP_LOCALES (Cyrillic, Greek, Arabic and
  Latin scripts); for a user's corpus, the first examples."""
  chosen = [groups.index(g) for g in HEATMAP_LOCALES if g in groups]
  return (chosen or list(range(len(groups))))[:count]


register("nmt_dates", validate=validate, build=build, build_model=build_model,
         inference=inference)
