"""The sequence_tasks experiment: long-range dependencies for RNN, LSTM, GRU and attention.

config.data.task picks the task (copy, reverse, recall, adding: research/data/
sequence_tasks.py), config.model the model: `SequenceModel(**config.model, <head and
vocabulary for the task>, max_length=<the inputs' length>)` (research/models/sequence_model.py).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from research.data import sequence_tasks as data
from research.data.stream import GeneratedStream, eval_batches
from research.errors import ConfigError
from research.experiments.stack_config import (
  check_stack_keys,
  check_stack_sizes,
  parameter_count,
  parameter_keys,
)
from research.models.kinds import KINDS, RECURRENT
from research.models.sequence_model import SequenceModel
from research.training import config as checks
from research.training.experiment import Inference, Model, Workload, register

TASKS = ("copy", "reverse", "adding", "recall")
ADDING_TOLERANCE = 0.04
# Host bytes per generated step (an adding step's float32 value and marker, and the
# generators' float64 / int64 temporaries: recall draws num_symbols keys per example).
EXAMPLE_BYTES = 16
SIZES = ("data.length", "data.num_symbols", "data.num_items", "data.eval_examples")
LENGTH_KEYS = ("data.length", "data.num_items")     # the inputs' length (`sequence_length`)


def validate(config) -> None:
  """Raises ConfigError for a bad config.data / config.model value, naming the key."""
  checks.check_choice(config, "data.task", TASKS)
  checks.check_choice(config, "model.kind", KINDS)
  checks.check_choice(config, "model.causal", (True, False))
  check_stack_keys(config, causal=config.model.causal)
  checks.check_positive(config, *SIZES)
  if config.data.task == "adding" and config.data.length < 2:
    raise ConfigError(f"config.data.length={config.data.length} must be >= 2 for the adding "
                      "problem (one marker in each half)")
  if config.data.task == "recall" and config.data.num_items > config.data.num_symbols:
    raise ConfigError(f"config.data.num_items={config.data.num_items} must be <= "
                      f"config.data.num_symbols={config.data.num_symbols} (recall's keys are "
                      "distinct)")
  m, d = config.model, config.data
  check_stack_sizes(config, sequence_length(config), ", ".join(
      f"config.{key}={checks.get(config, key)}"
      for key in (LENGTH_KEYS[:1] if d.task == "adding" else LENGTH_KEYS)))
  if m.kind in RECURRENT:        # an LSTM layer: 8 h² at most
    keys, count = ("model.num_layers", "model.hidden_size"), m.num_layers * 8 * m.hidden_size**2
  else:
    keys = parameter_keys(config, *LENGTH_KEYS)
    count = parameter_count(config, sequence_length(config))
  checks.check_parameter_memory(config, (*keys, "data.num_symbols"),
                                    count + (2 * d.num_symbols + 2) * m.hidden_size)
  examples = config.train.batch_size + 2 * d.eval_examples      # (eval_batches copy them)
  keys = ("train.batch_size", "data.eval_examples", "data.length") + {
      "adding": (), "recall": ("data.num_items", "data.num_symbols")}.get(d.task, ("data.num_items",))
  per_example = sequence_length(config) + (d.num_symbols if d.task == "recall" else 0)
  checks.check_host_memory(config, keys, examples * EXAMPLE_BYTES * per_example,
                               f"{examples} generated examples of {sequence_length(config)} steps")


def sequence_length(config) -> int:
  """The inputs' length: T (adding), else K + T + 1 + K (copy, reverse) or 2K + T + 1."""
  d = config.data
  return d.length if d.task == "adding" else 2 * d.num_items + d.length + 1


def generator(config):
  """generate(rng, batch_size) -> batch for config.data (see research/data/sequence_tasks.py)."""
  d = config.data
  if d.task == "adding":
    return functools.partial(data.adding_problem, length=d.length)
  if d.task == "recall":
    return functools.partial(data.associative_recall, length=d.length,
                             num_symbols=d.num_symbols, num_items=d.num_items)
  return functools.partial(data.copy_memory, length=d.length, num_symbols=d.num_symbols,
                           num_items=d.num_items, reverse=d.task == "reverse")


def make_model(config) -> SequenceModel:
  """config.model's SequenceModel with the head and vocabulary that config.data.task needs.

  Keys: config.data.{task, length (T), num_symbols (n), num_items (K), eval_examples};
  config.model holds the fields of `SequenceModel` that the task does not set: kind, causal
  and the stack's keys (hidden_size, num_layers, num_heads, mlp_size, attention, window, …,
  dropout_rate: research/experiments/stack_config.py).
  """
  d = config.data
  vocab_size = {"copy": d.num_symbols + 2, "reverse": d.num_symbols + 2,
                "recall": 2 * d.num_symbols + 1, "adding": None}[d.task]
  return SequenceModel(**config.model, num_outputs=1 if d.task == "adding" else d.num_symbols,
                       head="per_position" if d.task in ("copy", "reverse") else "last",
                       vocab_size=vocab_size, max_length=sequence_length(config))


def example_metrics(task: str, outputs: jax.Array, targets: jax.Array
                    ) -> dict[str, tuple[jax.Array, jax.Array]]:
  """{name: (numerator [B], denominator [B])} from the model's outputs and the targets.

  outputs: copy / reverse [B, L, n] (the last K positions are scored against targets
  [B, K]); recall [B, n] against targets [B]; adding [B, 1] against targets [B]:

    copy, reverse   per-position logits; cross-entropy on the K output positions;
                    metrics accuracy (per symbol) and exact_match (all K symbols right)
    recall          logits at the last position; cross-entropy; accuracy
    adding          a scalar at the last position; loss = mse (the constant 1 scores ≈ 0.167);
                    accuracy = fraction with |error| < 0.04 (Hochreiter & Schmidhuber 1997)
  """
  if task == "adding":
    error = outputs[:, 0] - targets
    ones = jnp.ones_like(error)
    squared = jnp.square(error)
    return {"loss": (squared, ones), "mse": (squared, ones),
            "accuracy": ((jnp.abs(error) < ADDING_TOLERANCE).astype(jnp.float32), ones)}
  if task == "recall":
    outputs, targets = outputs[:, None], targets[:, None]
  else:
    outputs = outputs[:, -targets.shape[1]:]
  cross_entropy = optax.softmax_cross_entropy_with_integer_labels(outputs, targets)   # [B, K]
  correct = (jnp.argmax(outputs, axis=-1) == targets).astype(jnp.float32)            # [B, K]
  count = jnp.full(targets.shape[:1], targets.shape[1], jnp.float32)
  metrics = {"loss": (cross_entropy.sum(1), count), "accuracy": (correct.sum(1), count)}
  if task != "recall":
    metrics["exact_match"] = (correct.min(1), jnp.ones_like(count))
  return metrics


def build_model(config, read=None) -> Model:
  """make_model(config), initialised on one generated example; no extras: the inputs are
  the config's (see research/data/sequence_tasks.py), ints [B, sequence_length(config)],
  or floats [B, T, 2] (value, marker) for adding."""
  del read     # the run writes no file
  model = make_model(config)
  example = generator(config)(np.random.default_rng(0), 1)["inputs"]
  return Model(model, lambda rng: model.init(rng, jnp.asarray(example))["params"])


def inference(config, model, extras) -> Inference:
  """The model's outputs for inputs laid out as config.data.task's generator lays them
  (research/data/sequence_tasks.py)."""
  del extras     # none: the inputs are the task's
  d, example = config.data, generator(config)(np.random.default_rng(0), 1)["inputs"]
  n, k, length = d.num_symbols, d.num_items, example.shape[1]
  inputs = {
      "adding": f"(value, marker) at each of {length} steps: the values in [0, 1), two of them "
                "marked 1, one in each half",
      "recall": f"tokens k_1 v_1 … k_{k} v_{k}, {d.length} blanks (0), a query "
                f"key; key s is the token s + 1 (s < {n}), value v the token {n + 1} + v",
      "copy": f"tokens: {k} symbols, {d.length} blanks (0), the delimiter "
              f"{n + 1}, {k} blanks; symbol s is the token s + 1 (s < {n})"}
  outputs = {
      "adding": "the sum of the two marked values",
      "recall": "the logits of the value stored under the query key",
      "copy": f"logits of the {n} symbols at each position: the last {k} give the symbols in "
              "their order" + (", reversed" if d.task == "reverse" else "")}
  task = "copy" if d.task == "reverse" else d.task       # (the same layout)

  def function(params, inputs):
    return {"outputs": model.apply({"params": params}, inputs)}

  return Inference(function, {"inputs": (jax.ShapeDtypeStruct(example.shape, example.dtype),
                                         inputs[task])},
                   {"outputs": outputs[task]}, {"task": d.task})


def build(config) -> Workload:
  """Model, data and loss for config (validated); see research/training/experiment.py.

  Training batch i is generated by GeneratedStream, its rows' block j from
  np.random.default_rng([config.seed, i, j]); the config.data.eval_examples evaluation
  examples from SeedSequence(config.seed, spawn_key=(1,)), a stream no training batch uses.
  """
  generate, (model, init, _), task = generator(config), build_model(config), config.data.task
  eval_rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(1,)))

  def evaluate(params, batch, rng=None):
    """Metrics of a batch; with an rng in training mode (dropout drawn from it)."""
    outputs = model.apply({"params": params}, batch["inputs"], train=rng is not None,
                          rngs=None if rng is None else {"dropout": rng})
    return example_metrics(task, outputs, batch["targets"])

  def loss(params, batch, rng):
    totals = {name: n.sum() / d.sum() for name, (n, d) in evaluate(params, batch, rng).items()}
    return totals.pop("loss"), totals

  return Workload(init=init,
              train_data=GeneratedStream(generate, config.train.batch_size, config.seed),
              eval_data=eval_batches(generate(eval_rng, config.data.eval_examples),
                                     config.train.batch_size),
              loss=loss, evaluate=evaluate)


register("sequence_tasks", validate=validate, build=build, build_model=build_model,
         inference=inference)
