"""What every experiment classifying padded token sequences shares (ListOps; LRA's Text,
Retrieval, Image and Pathfinder): batches bucketed by length, the loss, the metrics and the
final test report.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from research.data.stream import ShuffledStream, eval_batches
from research.training.experiment import Report, Workload

Split = dict[str, np.ndarray]
BUCKET_MULTIPLE = 64


def bucket_boundaries(lengths: np.ndarray, count: int, max_length: int) -> tuple[int, ...]:
  """`count` quantiles of `lengths`, rounded up to a multiple of 64 and capped at
  max_length (which is always the last), without repeats."""
  quantiles = np.quantile(lengths, np.arange(1, count) / count) if count > 1 else []
  rounded = {min(max_length, -(-int(q) // BUCKET_MULTIPLE) * BUCKET_MULTIPLE) for q in quantiles}
  return tuple(sorted(rounded | {max_length}))


def bucket_lengths(split: Split) -> np.ndarray:
  """Each example's length for bucketing [N]: a pair's longer document."""
  lengths = split["lengths"]
  return lengths.max(-1) if lengths.ndim > 1 else lengths


def batches(split: Split, batch_size: int, boundaries: tuple[int, ...]) -> list[dict]:
  """Every example of a split once, bucketed when there are boundaries (see eval_batches)."""
  return eval_batches(split, batch_size, bucket_lengths(split) if boundaries else None,
                      boundaries, trim=("tokens",))


def example_metrics(logits, labels) -> dict:
  """{"loss", "accuracy"}: (per-example value [B], its weight [B] = 1)."""
  cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  ones = jnp.ones_like(correct)
  return {"loss": (cross_entropy, ones), "accuracy": (correct, ones)}


def classification_workload(config, model: nn.Module, init, splits: dict[str, Split],
                            boundaries: tuple[int, ...] = ()) -> Workload:
  """The Workload (research/training/experiment.py) training `model` on splits["train"],
  evaluating on splits["val"] and reporting on splits["test"].

  A split is {"tokens" [N, L] or [N, 2, L] (document pairs), "lengths" [N] or [N, 2],
  "labels" [N]}; `boundaries` (ascending, the last the longest input) buckets the examples by
  their longest length, and a batch's tokens are cut to its bucket's bound (one compiled step
  per bucket); no boundaries: every batch is padded to the inputs' length. The model maps
  (tokens, lengths) to logits [B, C]; loss: the mean cross-entropy of the logits; metrics:
  loss and accuracy, on "val" during training, on "test" in the final report (test/loss,
  test/accuracy).
  """
  train = splits["train"]

  def loss(params, batch, rng):
    logits = model.apply({"params": params}, batch["tokens"], batch["lengths"], train=True,
                         rngs={"dropout": rng})
    metrics = {name: n.mean() for name, (n, _) in example_metrics(logits, batch["labels"]).items()}
    return metrics.pop("loss"), metrics

  def evaluate(params, batch):
    logits = model.apply({"params": params}, batch["tokens"], batch["lengths"])
    return example_metrics(logits, batch["labels"])

  evaluate_jit = jax.jit(evaluate)

  def report(params) -> Report:
    sums = {}
    for batch in batches(splits["test"], config.train.batch_size, boundaries):
      weight = batch.pop("weight")
      for name, (n, d) in jax.device_get(evaluate_jit(params, batch)).items():
        sums[name] = sums.get(name, np.zeros(2)) + [np.sum(weight * n), np.sum(weight * d)]
    return Report({f"test/{name}": float(n / d) for name, (n, d) in sums.items()})

  stream = ShuffledStream(train, config.train.batch_size, config.seed,
                          bucket_lengths(train) if boundaries else None, boundaries,
                          trim=("tokens",))
  return Workload(init=init, train_data=stream,
                  eval_data=batches(splits["val"], config.train.batch_size, boundaries),
                  loss=loss, evaluate=evaluate, report=report)
