"""The task registry: every experiment's task registers itself under its `config.task` name.

    from research import tasks
    task = tasks.get(config.task)         # validate(config), build(config) -> Task
    train_and_evaluate(config, workdir, task)

Your own task (in a notebook, say) plugs in the same way:
`tasks.register("my_task", validate=my_validate, build=my_build)`.
"""

from collections.abc import Callable

from research.errors import ConfigError
from research.training.task import Task, TaskBuilder

_REGISTRY: dict[str, TaskBuilder] = {}


def register(name: str, *, validate: Callable[..., None], build: Callable[..., Task],
             build_shapes: Callable[..., Task] | None = None,
             generates_data: Callable[..., bool] | None = None) -> TaskBuilder:
  """Adds a task under `name` (the value of config.task) and returns it (build_shapes,
  generates_data: see `research.training.task.TaskBuilder`)."""
  if name in _REGISTRY:
    raise ValueError(f"a task named {name!r} is registered already")
  _REGISTRY[name] = TaskBuilder(name, validate, build, build_shapes, generates_data)
  return _REGISTRY[name]


def get(name: str) -> TaskBuilder:
  """The task registered as `name`; ConfigError naming the registered ones otherwise."""
  if name not in _REGISTRY:
    raise ConfigError(f"config.task={name!r} is not allowed; choose one of: "
                      f"{', '.join(map(repr, names()))}")
  return _REGISTRY[name]


def names() -> list[str]:
  """The registered task names, sorted."""
  return sorted(_REGISTRY)
