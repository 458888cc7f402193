"""Config keys that were renamed: an old key on the command line, in a sweep or in a
workdir's config.json is refused with a message that names the new one. Keys that were
added (ADDED_KEYS): a workdir's config.json written before one is the same config where
the key now holds the value that stood for the code's behaviour then.

  model.dropout     -> model.dropout_rate   char_lm, nmt_dates (listops' spelling)
  model.mlp_ratio   -> model.mlp_size       char_lm: the MLP's width itself, no longer a
                                            multiple of hidden_size (ratio 4 at hidden_size
                                            256 is mlp_size 1024)
  model.cell        -> model.kind           nmt_dates: rnn | lstm | gru, as in the others
  model.local_window -> model.window        nmt_dates: local_m / local_p's half-width D, as
                                            the local attentions' window elsewhere
"""

RENAMED_KEYS = {
    "model.dropout": ("model.dropout_rate", ""),
    "model.mlp_ratio": ("model.mlp_size", "the MLP's width itself, mlp_ratio × hidden_size"),
    "model.cell": ("model.kind", "rnn, lstm or gru, as model.kind in every experiment"),
    "model.local_window": ("model.window", "the half-width D of local_m / local_p"),
}


# key: the value that means what a config.json without the key ran
ADDED_KEYS = {
    "model.positions": "sinusoidal",          # sequence_tasks' blocks (listops and lra had it)
    "model.mixer_gate": "none",               # nothing after the blocks' mixer
    "train.recurrence_learning_rate": 0.0,    # one rate for every parameter
    "model.dtype": "float32",                 # kernel_regression (the others had it)
}


def renamed(key: str) -> str | None:
  """'config.<key>, now called config.<new key> (what changed)' for a renamed key, else None."""
  if key not in RENAMED_KEYS:
    return None
  new, change = RENAMED_KEYS[key]
  return f"config.{key}, now called config.{new}" + (f" ({change})" if change else "")
