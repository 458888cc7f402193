"""Tokens, vocabularies and padded arrays for sequence-to-sequence text.

A user's own parallel corpus is a UTF-8 file with one `source<TAB>target` per line (the
Tatoeba / Anki export format); `read_parallel_corpus` tokenises it by character or by
whitespace-separated word, `Vocabulary` maps tokens to ids and `encode_pairs` pads a
list of pairs into the arrays a seq2seq model trains on.
"""

import collections
import json
import os
from collections.abc import Iterable, Sequence

import numpy as np
from absl import logging

from research.errors import InputError, excerpt

LEVELS = ("char", "word")
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD, BOS, EOS, UNK = range(len(SPECIAL_TOKENS))


def tokenize(text: str, level: str) -> list[str]:
  """Characters of `text` ("char") or its whitespace-separated words ("word")."""
  _check_level(level)
  return list(text) if level == "char" else text.split()


def detokenize(tokens: Sequence[str], level: str) -> str:
  """The text `tokenize(text, level)` came from (words rejoined with single spaces)."""
  _check_level(level)
  return ("" if level == "char" else " ").join(tokens)


def _check_level(level: str) -> None:
  if level not in LEVELS:
    raise ValueError(f"unknown tokenisation level {level!r}; expected one of {list(LEVELS)}")


class Vocabulary:
  """Token <-> id, with ids 0..3 for SPECIAL_TOKENS (<pad> = 0)."""

  def __init__(self, tokens: Sequence[str]):
    """tokens: every token in id order, starting with SPECIAL_TOKENS."""
    if tuple(tokens[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
      raise ValueError(f"a vocabulary starts with {SPECIAL_TOKENS}, got {list(tokens[:4])}")
    if len(set(tokens)) != len(tokens):
      raise ValueError("a vocabulary's tokens must be distinct")
    self.tokens = list(tokens)
    self.ids = {token: i for i, token in enumerate(self.tokens)}

  @classmethod
  def build(cls, sequences: Iterable[Sequence[str]], min_count: int = 1) -> "Vocabulary":
    """The special tokens, then every token seen >= min_count times, most frequent first
    (ties in code point order)."""
    counts = collections.Counter(token for sequence in sequences for token in sequence)
    kept = sorted((t for t, n in counts.items() if n >= min_count and t not in SPECIAL_TOKENS),
                  key=lambda t: (-counts[t], t))
    return cls(SPECIAL_TOKENS + tuple(kept))

  @property
  def size(self) -> int:
    return len(self.tokens)

  def encode(self, tokens: Sequence[str]) -> list[int]:
    """Ids of tokens, UNK for tokens outside the vocabulary; no BOS or EOS is added."""
    return [self.ids.get(token, UNK) for token in tokens]

  def decode(self, ids: Iterable[int]) -> list[str]:
    """Tokens of ids up to the first EOS, leaving out PAD and BOS."""
    tokens = []
    for i in map(int, ids):
      if i == EOS:
        break
      if i not in (PAD, BOS):
        tokens.append(self.tokens[i])
    return tokens

  def to_json(self) -> str:
    return json.dumps({"tokens": self.tokens}, ensure_ascii=False, indent=0)

  @classmethod
  def from_json(cls, text: str) -> "Vocabulary":
    """The vocabulary that `to_json` wrote as `text`."""
    return cls(json.loads(text)["tokens"])

  def save(self, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
      f.write(self.to_json())

  @classmethod
  def load(cls, path: str | os.PathLike) -> "Vocabulary":
    with open(path, encoding="utf-8") as f:
      return cls.from_json(f.read())


def read_parallel_corpus(path: str | os.PathLike, level: str = "char",
                         max_length: int | None = None) -> list[tuple[list[str], list[str]]]:
  """(source tokens, target tokens) per line of a `source<TAB>target` UTF-8 file.

  CRLF line endings and a byte-order mark are accepted; columns after the second
  (Tatoeba's attribution) are ignored, blank lines skipped and each side stripped of
  surrounding whitespace. Pairs with a side longer than `max_length` tokens are left
  out, with a warning that counts them (`parallel_corpus_pairs` reads without warning).
  A file that cannot be read, a line that is not UTF-8, has no tab or has an empty side,
  and a file without any pair, raise InputError naming `path:line`.
  """
  pairs, skipped = parallel_corpus_pairs(path, level, max_length)
  warn_skipped(path, skipped, len(pairs) + skipped, level, max_length)
  return pairs


def parallel_corpus_pairs(path: str | os.PathLike, level: str = "char",
                          max_length: int | None = None
                          ) -> tuple[list[tuple[list[str], list[str]]], int]:
  """(the pairs of `read_parallel_corpus`, how many longer pairs were left out), no warning."""
  _check_level(level)
  pairs, too_long = [], 0
  try:
    with open(path, "rb") as f:
      for number, raw in enumerate(f, start=1):
        pair = _parse_line(raw, f"{os.fspath(path)}:{number}", number, level)
        if pair is None:
          continue
        if max_length is not None and max(map(len, pair)) > max_length:
          too_long += 1
          continue
        pairs.append(pair)
  except OSError as error:
    raise InputError(f"{os.fspath(path)}: cannot be read ({error.strerror or error})") from None
  if not pairs:
    raise InputError(f"{os.fspath(path)}: no source<TAB>target pair to read "
                     + ("(the file is empty)" if not too_long else
                        f"(all {too_long} are longer than {max_length} tokens)"))
  return pairs, too_long


def warn_skipped(path: str | os.PathLike, skipped: int, total: int, level: str,
                 max_length: int | None) -> None:
  """The warning that counts the pairs left out for being longer than max_length."""
  if skipped:
    logging.warning("%s: skipped %d of %d pairs with a side longer than %d %s tokens",
                    os.fspath(path), skipped, total, max_length, level)


def _parse_line(raw: bytes, where: str, number: int, level: str
                ) -> tuple[list[str], list[str]] | None:
  """A line's (source tokens, target tokens), None for a blank line; InputError naming
  `where` for a line that is not UTF-8, has no tab or an empty side."""
  try:
    line = raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n")
  except UnicodeDecodeError as error:
    raise InputError(f"{where}: not UTF-8 ({error.reason} at byte {error.start}); save "
                     "the file as UTF-8") from None
  if not line.strip() and "\t" not in line:
    return None
  columns = line.split("\t")
  if len(columns) < 2:
    raise InputError(f"{where}: no tab between source and target in {excerpt(line, 80)}; each "
                     "line must be source<TAB>target")
  source, target = columns[0].strip(), columns[1].strip()
  for side, text in (("source", source), ("target", target)):
    if not text:
      raise InputError(f"{where}: empty {side} in {excerpt(line, 80)}; each line must be "
                       "source<TAB>target, both non-empty")
  return tokenize(source, level), tokenize(target, level)


def encode_pairs(pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
                 source_vocab: Vocabulary, target_vocab: Vocabulary,
                 max_source_length: int | None = None,
                 max_target_length: int | None = None) -> dict[str, np.ndarray]:
  """Token pairs as int32 arrays padded with PAD (0).

  Returns source [N, S], source_lengths [N], target_in [N, T + 1] (BOS + target),
  target_out [N, T + 1] (target + EOS) and target_lengths [N] (target length + 1), where
  S and T are the longest source and target, or max_source_length and max_target_length
  when given (a longer sequence then raises ValueError).
  """
  source_lengths = np.array([len(source) for source, _ in pairs], dtype=np.int32)
  target_lengths = np.array([len(target) for _, target in pairs], dtype=np.int32)
  S = _padded_length(source_lengths, max_source_length, "source")
  T = _padded_length(target_lengths, max_target_length, "target")
  arrays = {name: np.zeros(shape, np.int32) for name, shape in
            (("source", (len(pairs), S)), ("target_in", (len(pairs), T + 1)),
             ("target_out", (len(pairs), T + 1)))}
  for n, (source, target) in enumerate(pairs):
    ids = target_vocab.encode(target)
    arrays["source"][n, :len(source)] = source_vocab.encode(source)
    arrays["target_in"][n, :len(ids) + 1] = [BOS, *ids]
    arrays["target_out"][n, :len(ids) + 1] = [*ids, EOS]
  return {**arrays, "source_lengths": source_lengths, "target_lengths": target_lengths + 1}


def _padded_length(lengths: np.ndarray, max_length: int | None, side: str) -> int:
  longest = int(lengths.max(initial=0))
  if max_length is None:
    return longest
  if longest > max_length:
    raise ValueError(f"a {side} of {longest} tokens exceeds max_{side}_length={max_length}")
  return max_length
