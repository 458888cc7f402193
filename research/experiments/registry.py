"""The experiment registry: every experiment registers itself under its `config.experiment` name.

    from research import experiments
    experiment = experiments.get(config.experiment)   # validate(config), build(config) -> Workload
    train_and_evaluate(config, workdir, experiment)
"""

from collections.abc import Callable

from research.errors import ConfigError
from research.training.experiment import Experiment, Inference, Model, Workload

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
