"""The mqar experiment: multi-query associative recall (Zoology), every causal sequence mixer.

A causal LanguageModel (research/models/language_model.py) reads sequences of
research/data/mqar.py, its logits at the N query positions alone. Loss: the mean cross-entropy
of the N values; eval/accuracy: the fraction of queries whose most likely next token is the
key's value (Zoology's "valid/accuracy").
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from research.data import mqar
from research.data.stream import ShuffledStream, eval_batches
from research.errors import ConfigError
from research.experiments.stack_config import (
  check_stack_keys,
  check_stack_sizes,
  parameter_count,
  parameter_keys,
)
from research.models.kinds import BLOCK_KINDS, KINDS
from research.models.language_model import LanguageModel
from research.training import config as checks
from research.training.experiment import Inference, Model, Workload, register

SIZES = ("data.length", "data.num_pairs", "data.vocab_size", "data.train_examples",
         "data.eval_examples", "model.embed_size")
GENERATION_BLOCK = 1024   # sequences drawn from one generator
# Host bytes per sequence position while the data is made: the int32 inputs kept, and
# the generator's float64 draws and int64 indices over V / 2 keys for a block at a time.
TOKEN_BYTES = 4


def validate(config) -> None:
  """Raises ConfigError for a bad config.data / config.model value, naming the key."""
  d, m = config.data, config.model
  checks.check_choice(config, "model.kind", KINDS)
  checks.check_choice(config, "model.tie_embeddings", (True, False))
  checks.check_choice(config, "data.random_non_queries", (True, False))
  check_stack_keys(config, causal=True)
  checks.check_positive(config, *SIZES, "data.power")
  checks.check_int(config, *SIZES, "data.seed")
  problem = mqar.check_sizes(d.length, d.num_pairs, d.vocab_size)
  if problem:
    raise ConfigError(f"config.data.length={d.length}, num_pairs={d.num_pairs}, "
                      f"vocab_size={d.vocab_size}: {problem}")
  if d.train_examples < config.train.batch_size:
    raise ConfigError(f"config.data.train_examples={d.train_examples} must be at least "
                      f"config.train.batch_size={config.train.batch_size}")
  if m.tie_embeddings and m.kind not in BLOCK_KINDS and m.embed_size != m.hidden_size:
    raise ConfigError(f"config.model.tie_embeddings with kind {m.kind!r} needs config.model."
                      f"embed_size={m.embed_size} equal to config.model.hidden_size="
                      f"{m.hidden_size} (the output layer is the embedding read backwards)")
  check_stack_sizes(config, d.length, f"config.data.length={d.length}")
  if m.kind in BLOCK_KINDS:
    keys, count = parameter_keys(config, "data.length"), parameter_count(config, d.length)
  else:        # an LSTM layer: 8 h² at most, the first one's input e wide
    keys = ("model.num_layers", "model.hidden_size", "model.embed_size")
    count = m.num_layers * 4 * m.hidden_size * (m.hidden_size + m.embed_size)
  checks.check_parameter_memory(config, (*keys, "data.vocab_size"),
                                    count + 2 * d.vocab_size * m.hidden_size)
  checks.check_host_memory(
      config, ("data.train_examples", "data.eval_examples", "data.length"),
      (d.train_examples + d.eval_examples) * d.length * TOKEN_BYTES
      + GENERATION_BLOCK * 16 * d.vocab_size, f"{d.train_examples + d.eval_examples} sequences "
      f"of {d.length} tokens")


def generate(config, split: int, count: int) -> dict[str, np.ndarray]:
  """`count` sequences of split 0 (training) or 1 (evaluation), block j of them from
  default_rng([config.data.seed, split, j]).

  Sequences of config.data.length tokens over a vocabulary of vocab_size, num_pairs key-value
  pairs each queried once at a power-law gap (power α). The training set is
  config.data.train_examples sequences (Zoology's 100 000), made once in blocks of
  GENERATION_BLOCK and reshuffled every epoch; the evaluation set is eval_examples more,
  never trained on."""
  d = config.data
  blocks = [mqar.multi_query_recall(
      np.random.default_rng([d.seed, split, j]), min(GENERATION_BLOCK, count - start),
      length=d.length, num_pairs=d.num_pairs, vocab_size=d.vocab_size, power=d.power,
      random_non_queries=d.random_non_queries)
            for j, start in enumerate(range(0, count, GENERATION_BLOCK))]
  return {name: np.concatenate([block[name] for block in blocks]) for name in blocks[0]}


def make_model(config) -> LanguageModel:
  """config.model's LanguageModel over the task's vocabulary and length:
  LanguageModel(**config.model, vocab_size, max_length=length). With model.tie_embeddings
  (Zoology's) the output layer is the input embedding."""
  return LanguageModel(**config.model, vocab_size=config.data.vocab_size,
                       max_length=config.data.length)


def example_metrics(logits: jax.Array, targets: jax.Array
                    ) -> dict[str, tuple[jax.Array, jax.Array]]:
  """{name: (numerator [B], denominator [B])} from the logits at the queries [B, N, V] and
  the values due there [B, N]."""
  cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits, targets)   # [B, N]
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  count = jnp.full(targets.shape[:1], targets.shape[1], jnp.float32)
  return {"loss": (cross_entropy.sum(1), count), "accuracy": (correct.sum(1), count)}


def build_model(config, read=None) -> Model:
  """make_model(config), initialised on one generated sequence; no extras."""
  del read     # the run writes no file
  model = make_model(config)
  example = generate(config, 1, 1)
  return Model(model, lambda rng: model.init(
      rng, jnp.asarray(example["inputs"]),
      logit_positions=jnp.asarray(example["positions"]))["params"])


def inference(config, model, extras) -> Inference:
  """The logits of the token after each of the given positions."""
  del extras
  d = config.data

  def function(params, inputs, positions):
    logits, _ = model.apply({"params": params}, inputs, logit_positions=positions)
    return {"logits": logits}

  half = d.vocab_size // 2
  return Inference(
      function,
      {"inputs": (jax.ShapeDtypeStruct((1, d.length), jnp.int32),
                  f"tokens: {d.num_pairs} pairs k_i v_i (keys 1 … {half - 1}, values "
                  f"{half} … {d.vocab_size - 1}), then each key again at an even position, "
                  "0 elsewhere"),
       "positions": (jax.ShapeDtypeStruct((1, d.num_pairs), jnp.int32),
                     "the positions of the queried keys")},
      {"logits": f"[batch, {d.num_pairs}, {d.vocab_size}]: the next token's logits after "
                 "each position; the answer is the argmax"},
      {"vocab_size": d.vocab_size, "num_pairs": d.num_pairs})


def build(config) -> Workload:
  """Model, data and loss for config (validated); see research/training/experiment.py."""
  d, (model, init, _) = config.data, build_model(config)

  def evaluate(params, batch, rng=None):
    """Metrics of a batch; with an rng in training mode (dropout drawn from it)."""
    logits, _ = model.apply({"params": params}, batch["inputs"], train=rng is not None,
                            logit_positions=batch["positions"],
                            rngs=None if rng is None else {"dropout": rng})
    return example_metrics(logits, batch["targets"])

  def loss(params, batch, rng):
    totals = {name: n.sum() / c.sum() for name, (n, c) in evaluate(params, batch, rng).items()}
    return totals.pop("loss"), totals

  return Workload(init=init,
                  train_data=ShuffledStream(generate(config, 0, d.train_examples),
                                            config.train.batch_size, config.seed),
                  eval_data=eval_batches(generate(config, 1, d.eval_examples),
                                         config.train.batch_size),
                  loss=loss, evaluate=evaluate)


register("mqar", validate=validate, build=build, build_model=build_model, inference=inference)
