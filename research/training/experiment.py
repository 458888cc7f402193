"""The contract between an experiment and the runtime (`Experiment`, `Workload`, `Model`,
`Inference`), and the registry experiments enter under their `config.experiment` name (the
built-in ones when research.experiments is imported). The loop, handed an Experiment, does the
rest (devices, optimizer, checkpoints, metrics); everything in a Workload except the data
streams is a pure function of parameters, batches and keys.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from research.data.stream import Batch, Stream
from research.errors import ConfigError

Params = Any
Array = jax.Array


class Heatmap(NamedTuple):
  """A matrix to draw, e.g. attention weights [target_len, source_len]."""
  values: Any                    # [rows, cols]
  row_labels: list[str]
  col_labels: list[str]
  title: str = ""


class Report(NamedTuple):
  """What a workload computes once training ends, beyond the periodic evaluation."""
  metrics: dict[str, float]                        # e.g. {"test/exact_match_beam": 0.99}
  heatmaps: dict[str, Heatmap] = {}                # file stem -> heatmap (drawn to PNG)
  texts: dict[str, str] = {}                       # file name -> content (e.g. predictions)


class Workload(NamedTuple):
  """What the train loop trains: parameters' init, the data, the loss and the evaluation."""
  init: Callable[[Array], Params]
  # init(rng) -> params.
  train_data: Stream
  # global batches of config.train.batch_size; its state is checkpointed.
  eval_data: list[Batch]
  # fixed evaluation batches of config.train.batch_size, each with a float `weight` [B].
  loss: Callable[[Params, Batch, Array], tuple[Array, dict[str, Array]]]
  # loss(params, batch, rng) -> (scalar mean loss, {name: scalar}) on a training batch;
  # rng drives dropout / sampling. Metric names carry no prefix ("accuracy").
  evaluate: Callable[[Params, Batch], dict[str, tuple[Array, Array]]]
  # evaluate(params, batch) -> {name: (numerator [B], denominator [B])}; the loop
  # reports Σ weight·numerator / Σ weight·denominator over the evaluation set.
  report: Callable[[Params], Report] | None = None
  # report(params) after the last step (decoding, sample predictions, heatmaps).
  loss_weight: Callable[[Batch], Array] | None = None
  # loss_weight(batch) -> the scalar the loss's sum is divided by (e.g. target tokens) where
  # it differs between batches of one shape; None: the loss is a mean over the batch's rows.
  # Gradient accumulation (config.train.grad_accum_steps) weights microbatches by it.
  files: dict[str, str] = {}
  # file name -> content, written into the workdir at the start (e.g. vocabularies).


class Model(NamedTuple):
  """A run's model without its data (`Experiment.build_model`): what `build` trains and
  `research.training.run.restore` reads a checkpoint into."""
  module: Any
  # the flax Module: module.apply({"params": params}, ...) as the experiment calls it.
  init: Callable[[Array], Params]
  # init(rng) -> params; their tree and shapes are what a checkpoint must hold.
  extras: dict[str, Any] = {}
  # what answering raw input needs beyond the config (vocabularies, training points).


class Inference(NamedTuple):
  """What a run's model answers (`Experiment.inference`), for `launch.py --export`, which
  closes `function` over the run's parameters and makes the inputs' first axis, the batch,
  symbolic (any size)."""
  function: Callable[..., dict[str, Array]]
  # function(params, *inputs) -> {output name: array}: jit-able, pure, without the data.
  inputs: dict[str, tuple[jax.ShapeDtypeStruct, str]]
  # input name -> (its shape and dtype for a batch of 1, what it holds), in the order
  # `function` takes them; every input's first axis is the batch.
  outputs: dict[str, str]
  # output name -> what it holds (the shapes and dtypes are the function's).
  about: dict[str, Any] = {}
  # what a user needs beyond the shapes to make the inputs and read the outputs, as JSON
  # values: vocabularies (token lists, id = index), special ids, lengths.


class Experiment(NamedTuple):
  """An experiment as the loop receives it: how to check a config and build its workload
  (`validate`, `build`), and optionally its compile-only shapes, its model alone (for
  `research.training.run.restore`) and its inference function (for `launch.py --export`)."""
  name: str                                        # the value of config.experiment
  validate: Callable[[Any], None]
  # validate(config): ConfigError naming the bad config.model / config.data key and the
  # allowed values, before any build.
  build: Callable[[Any], Workload]
  # build(config) -> Workload (model, data and pure loss / evaluation functions) for a
  # validated config; InputError for a malformed user file.
  build_shapes: Callable[[Any], Workload] | None = None
  # build_shapes(config) -> a Workload to compile, not train (`--compile_only`): the real
  # model, loss and evaluation, with batches of the largest shape training meets, without
  # reading or generating the data. None: `build` is cheap enough.
  generates_data: Callable[[Any], bool] | None = None
  # generates_data(config): True when build(config) would spend minutes making data (the
  # loop then compiles build_shapes(config)'s step first, refusing what cannot run before
  # the wait; otherwise it builds, reading and checking the user's files, before compiling
  # anything). None: never.
  build_model: Callable[[Any, Callable[[str], str]], Model] | None = None
  # build_model(config, read) -> Model for the config of a run, without reading or generating
  # its data: read(name) is the text of a file the run wrote into its workdir (one of the
  # Workload's `files`; `build` makes its model with it, passing those it is about to write).
  # None: its runs cannot be restored (research.training.run.restore needs it).
  inference: Callable[[Any, Any, dict[str, Any]], Inference] | None = None
  # inference(config, module, extras) -> Inference for a run's config and the module and
  # extras of its build_model: what the run's model answers, as one function of the
  # parameters and the inputs (`launch.py --export`, research/training/export.py). None: its
  # runs cannot be exported.


# ---- The registry -----------------------------------------------------------------------------
_REGISTRY: dict[str, Experiment] = {}
BUILT_IN = "research.experiments."     # the modules of the built-in experiments


def register(name: str, *, validate: Callable[..., None], build: Callable[..., Workload],
             build_shapes: Callable[..., Workload] | None = None,
             generates_data: Callable[..., bool] | None = None,
             build_model: Callable[..., Model] | None = None,
             inference: Callable[..., Inference] | None = None) -> Experiment:
  """Adds an experiment under `name` (the value of config.experiment) and returns it
  (build_shapes, generates_data, build_model, inference: see
  `research.training.experiment.Experiment`).

  Your own experiment (in a notebook, say) plugs in the same way:
  `experiments.register("mine", validate=my_validate, build=my_build)`; with
  `build_model=my_build_model` its runs can be restored too (`research.training.restore`), and
  with `inference=my_inference` exported (`launch.py --export`).

  Registering a name again replaces the earlier registration, so that a notebook cell that
  registers an experiment runs again; a built-in experiment's name (one of research/
  experiments/) is refused with a ValueError."""
  if name in _REGISTRY and _REGISTRY[name].build.__module__.startswith(BUILT_IN):
    raise ValueError(f"{name!r} is a built-in experiment ({_REGISTRY[name].build.__module__}): "
                     "register yours under another name")
  _REGISTRY[name] = Experiment(name, validate, build, build_shapes, generates_data, build_model,
                               inference)
  return _REGISTRY[name]


def get(name: str) -> Experiment:
  """The experiment registered as `name`; ConfigError naming the registered ones otherwise."""
  if name not in _REGISTRY:
    raise ConfigError(f"config.experiment={name!r} is not allowed; choose one of: "
                      f"{', '.join(map(repr, names()))}")
  return _REGISTRY[name]


def names() -> list[str]:
  """The registered experiment names, sorted."""
  return sorted(_REGISTRY)
