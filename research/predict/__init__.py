"""A restored run answers raw input: one module per experiment, each a pure function of the run
(`research.training.restore`) and the input, batched and jit-compiled.

    from research import predict, training
    run = training.restore("runs/nmt_dates-20261126-120000")
    predict.translate(run, ["14 janvier 2024", "2024年1月14日"]).outputs

  nmt_dates          translate(run, texts, beam_size=1) -> Translations (outputs, tokens,
                     the attention [T, S] of each text, beam scores)
  char_lm            sample(run, prompt, length=..., temperature, top_k) -> [bytes];
                     bits_per_byte(run, text), byte_bits(run, text) [N]
  listops            classify(run, expressions) -> Classifications (labels, probabilities,
                     the attention [B, H, S, S] of each layer)
  mqar               recall(run, inputs, positions) -> Recalls (the next token at each
                     position, its probability, the attention [B, H, L, L] of each layer)
  sequence_tasks     predict_sequences(run, inputs) -> SequencePredictions
  kernel_regression  regress(run, x) -> {kernel: Regression (estimates [N], weights [N, n])}

Input the run's model cannot take is refused with one research.errors.InputError naming the
offending part and what the model takes, before anything compiles.
"""

from research.predict.char_lm import bits_per_byte, byte_bits, sample
from research.predict.kernel_regression import Regression, regress
from research.predict.listops import Classifications, Encoded, classify, encode_expressions
from research.predict.mqar import Recalls, recall
from research.predict.nmt_dates import Translations, encode_texts, translate
from research.predict.sequence_tasks import SequencePredictions, predict_sequences

__all__ = ["Classifications", "Encoded", "Recalls", "Regression", "SequencePredictions",
           "Translations", "bits_per_byte", "byte_bits", "classify", "encode_expressions",
           "encode_texts", "predict_sequences", "recall", "regress", "sample", "translate"]
