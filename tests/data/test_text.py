"""Tokenisation, vocabularies, the TSV reader and padding, on hand-written examples."""

import logging

import numpy as np
import pytest

from research.data.text import (
  BOS,
  EOS,
  PAD,
  UNK,
  Vocabulary,
  detokenize,
  encode_pairs,
  read_parallel_corpus,
  tokenize,
)
from research.errors import InputError


def test_tokenize():
  assert tokenize("14 janv.", "char") == ["1", "4", " ", "j", "a", "n", "v", "."]
  assert tokenize("  le  14 janvier\t2024 ", "word") == ["le", "14", "janvier", "2024"]
  assert detokenize(["le", "14"], "word") == "le 14"
  assert detokenize(list("2024年1月"), "char") == "2024年1月"
  with pytest.raises(ValueError, match=r"unknown tokenisation level 'byte'.*'char', 'word'"):
    tokenize("x", "byte")


def test_vocabulary_ids():
  vocab = Vocabulary.build([["b", "a", "b"], ["c", "b", "a"]])
  assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
  assert vocab.tokens == ["<pad>", "<bos>", "<eos>", "<unk>", "b", "a", "c"]
  assert vocab.size == 7
  assert vocab.encode(["a", "z", "c"]) == [5, 3, 6]
  assert vocab.decode([1, 5, 0, 4, 3, 2, 6, 6]) == ["a", "b", "<unk>"]
  assert vocab.decode(np.array([4, 4])) == ["b", "b"]
  assert Vocabulary.build([["a", "b", "b"]], min_count=2).tokens[4:] == ["b"]


def test_vocabulary_round_trip_and_save_load(tmp_path):
  text = "dimanche 14 janvier 2024 → 2024年1月14日"
  vocab = Vocabulary.build([tokenize(text, "char")])
  assert detokenize(vocab.decode(vocab.encode(tokenize(text, "char")) + [EOS, 7]), "char") == text
  vocab.save(tmp_path / "vocab.json")
  loaded = Vocabulary.load(tmp_path / "vocab.json")
  assert loaded.tokens == vocab.tokens
  assert loaded.encode(list(text)) == vocab.encode(list(text))


def test_vocabulary_must_start_with_special_tokens():
  with pytest.raises(ValueError, match="starts with"):
    Vocabulary(["a", "<pad>", "<bos>", "<eos>", "<unk>"])
  with pytest.raises(ValueError, match="distinct"):
    Vocabulary(["<pad>", "<bos>", "<eos>", "<unk>", "a", "a"])


def test_read_parallel_corpus(tmp_path):
  path = tmp_path / "fra.txt"
  path.write_bytes("\ufeffGo.\tVa !\tCC-BY 2.0 (France) #2877272\n\n"
                   "I won.\tJ'ai gagné.\r\n  \nHi there \t Salut \n".encode())
  assert read_parallel_corpus(path, level="word") == [
    (["Go."], ["Va", "!"]), (["I", "won."], ["J'ai", "gagné."]), (["Hi", "there"], ["Salut"])]
  assert read_parallel_corpus(path)[0] == (["G", "o", "."], ["V", "a", " ", "!"])


@pytest.mark.parametrize("bad_line, problem", [
  ("no tab here", "no tab"),
  ("\tcible", "empty source"),
  ("source\t  ", "empty target"),
  ("\t", "empty source"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, problem):
  path = tmp_path / "corpus.tsv"
  path.write_text(f"a\tb\n\nc\td\n{bad_line}\ne\tf\n", encoding="utf-8")
  with pytest.raises(InputError, match=rf"corpus\.tsv:4: {problem}"):
    read_parallel_corpus(path)


def test_invalid_utf8_names_file_and_line(tmp_path):
  path = tmp_path / "latin1.tsv"
  path.write_bytes(b"a\tb\n" + "é\te\n".encode("latin-1"))
  with pytest.raises(InputError, match=r"latin1\.tsv:2: not UTF-8"):
    read_parallel_corpus(path)


@pytest.mark.parametrize("content", ["", "\n\n", "\ufeff\r\n  \r\n"])
def test_a_file_without_pairs_is_named(tmp_path, content):
  path = tmp_path / "empty.tsv"
  path.write_text(content, encoding="utf-8")
  with pytest.raises(InputError, match=r"empty\.tsv: no source<TAB>target pair.*empty"):
    read_parallel_corpus(path)


def test_pairs_longer_than_max_length_are_skipped_and_counted(tmp_path, caplog):
  path = tmp_path / "long.tsv"
  path.write_text("ab\tc\n" + "x" * 50_000 + "\ty\nde\tfghi\nj\t" + "k" * 5 + "\n",
                  encoding="utf-8")
  with caplog.at_level(logging.WARNING):
    pairs = read_parallel_corpus(path, max_length=4)
  assert pairs == [(["a", "b"], ["c"]), (["d", "e"], ["f", "g", "h", "i"])]
  assert "long.tsv: skipped 2 of 4 pairs with a side longer than 4 char tokens" in caplog.text
  assert len(read_parallel_corpus(path)) == 4
  with pytest.raises(InputError, match=r"all 4 are longer than 0 tokens"):
    read_parallel_corpus(path, max_length=0)


def test_read_rejects_unknown_level(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("a\tb\n")
  with pytest.raises(ValueError, match="tokenisation level"):
    read_parallel_corpus(path, level="sentence")


def test_encode_pairs_hand_example():
  source_vocab = Vocabulary(["<pad>", "<bos>", "<eos>", "<unk>", "a", "b"])
  target_vocab = Vocabulary(["<pad>", "<bos>", "<eos>", "<unk>", "x", "y", "z"])
  pairs = [(["a", "b", "a"], ["x"]), (["b"], ["y", "z", "q"])]
  arrays = encode_pairs(pairs, source_vocab, target_vocab)
  expected = {
    "source": [[4, 5, 4], [5, 0, 0]],
    "source_lengths": [3, 1],
    "target_in": [[1, 4, 0, 0], [1, 5, 6, 3]],
    "target_out": [[4, 2, 0, 0], [5, 6, 3, 2]],
    "target_lengths": [2, 4],
  }
  assert set(arrays) == set(expected)
  for name, values in expected.items():
    assert arrays[name].dtype == np.int32, name
    np.testing.assert_array_equal(arrays[name], values, err_msg=name)


def test_encode_pairs_fixed_lengths():
  vocab = Vocabulary.build([["a", "b"]])
  arrays = encode_pairs([(["a"], ["b", "a"])], vocab, vocab, max_source_length=4,
                        max_target_length=3)
  assert arrays["source"].shape == (1, 4) and arrays["target_in"].shape == (1, 4)
  np.testing.assert_array_equal(arrays["target_out"], [[5, 4, 2, 0]])
  with pytest.raises(ValueError, match="a target of 2 tokens exceeds max_target_length=1"):
    encode_pairs([(["a"], ["b", "a"])], vocab, vocab, max_target_length=1)
  empty = encode_pairs([], vocab, vocab)
  assert empty["source"].shape == (0, 0) and empty["target_in"].shape == (0, 1)
