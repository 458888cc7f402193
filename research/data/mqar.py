"""Multi-query associative recall (MQAR; Arora, Eyuboglu et al. 2024, "Zoology", §3): a
sequence opens with N key-value pairs and then asks for every key once, at power-law gaps;
the model must give each queried key's value, and the loss and the accuracy count these N
answers alone.
"""

import numpy as np

Batch = dict[str, np.ndarray]
FILLER = 0


def check_sizes(length: int, num_pairs: int, vocab_size: int) -> str | None:
  """What makes (L, N, V) impossible, in words naming the sizes, or None when it is possible."""
  if 4 * num_pairs > length:
    return (f"{num_pairs} pairs need a length of at least 4 × {num_pairs} = {4 * num_pairs} "
            f"(2N tokens of pairs and N query slots of 2 tokens), got {length}")
  if vocab_size // 2 - 1 < num_pairs:
    return (f"{num_pairs} distinct keys need a vocabulary of at least 2 × ({num_pairs} + 1) = "
            f"{2 * (num_pairs + 1)} (keys are the tokens 1 … V/2 − 1), got {vocab_size}")
  return None


def gap_probabilities(length: int, num_pairs: int, power: float) -> np.ndarray:
  """P(g) ∝ (g + 1)^(α − 1) over the S = ⌊(L − 2N) / 2⌋ gaps g = 0 … S − 1: [S] float64."""
  slots = (length - 2 * num_pairs) // 2
  weights = np.arange(1, slots + 1, dtype=np.float64) ** (power - 1.0)
  return weights / weights.sum()


def multi_query_recall(rng: np.random.Generator, batch_size: int, *, length: int,
                       num_pairs: int, vocab_size: int, power: float = 0.01,
                       random_non_queries: bool = False) -> Batch:
  """B MQAR sequences, each of length L over a vocabulary of V tokens:

    k_1 v_1 k_2 v_2 … k_N v_N | 0 … 0 k_{σ(1)} 0 … 0 k_{σ(2)} … 0        (L tokens)

    keys     N distinct tokens of [1, V/2)          (token 0 is the filler)
    values   N distinct tokens of [V/2, V)
    queries  key i is repeated at position 2N + 2 g_i, where the gaps g_1 … g_N are distinct
             draws from {0, …, S − 1}, S = ⌊(L − 2N) / 2⌋, with P(g) ∝ (g + 1)^(α − 1)
             (a power law, α = `power`; α = 1 is uniform, Zoology's α = 0.01 puts most
             queries right after the pairs); drawn without replacement by the Gumbel top-k
             trick, which is sequential sampling proportional to P
    targets  at each query position the model predicts the next token, the key's value;
             the loss and the accuracy count these N positions only

  The other positions hold the filler 0, or with `random_non_queries` a uniform token of
  [0, V) (Zoology's default; its Figure 2 keeps the filler). Needs L ≥ 4N (room for the pairs
  and N query slots) and V/2 − 1 ≥ N (N distinct keys); `check_sizes` says which is missing.

  Returns query positions and targets [B, N] (in the order of the pairs), not a label per
  position: a model applies its output layer at those N positions alone (V logits at all L
  positions cost L / N times as much, for nothing the loss reads).

  Returns:
    inputs [B, L] int32 tokens; positions [B, N] int32, where key i is queried (2N + 2 g_i);
    targets [B, N] int32, the value of key i (the token due after position i's query).
  """
  problem = check_sizes(length, num_pairs, vocab_size)
  if problem:
    raise ValueError(problem)
  half, rows = vocab_size // 2, np.arange(batch_size)[:, None]
  keys = 1 + top_k(rng.random((batch_size, half - 1)), num_pairs)            # [B, N] in [1, V/2)
  values = half + top_k(rng.random((batch_size, vocab_size - half)), num_pairs)   # [V/2, V)
  log_p = np.log(gap_probabilities(length, num_pairs, power))
  gaps = top_k(log_p - np.log(-np.log(rng.random((batch_size, log_p.size)))), num_pairs)
  positions = 2 * num_pairs + 2 * gaps                                       # [B, N]
  if random_non_queries:
    inputs = rng.integers(vocab_size, size=(batch_size, length))
  else:
    inputs = np.full((batch_size, length), FILLER)
  inputs[:, 0:2 * num_pairs:2], inputs[:, 1:2 * num_pairs:2] = keys, values
  inputs[rows, positions] = keys
  return {"inputs": inputs.astype(np.int32), "positions": positions.astype(np.int32),
          "targets": values.astype(np.int32)}


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
  """Indices of the k largest scores of each row, largest first: [B, k] int64. Of uniform
  scores, k distinct indices uniformly; of log-probabilities plus Gumbel noise, k draws
  without replacement proportional to the probabilities."""
  best = np.argpartition(-scores, k - 1, axis=1)[:, :k]
  order = np.argsort(-np.take_along_axis(scores, best, 1), axis=1, kind="stable")
  return np.take_along_axis(best, order, 1)
