"""A restored run answers raw input: one module per experiment, each a pure function of the run
(`research.training.restore`) and the input, batched and jit-compiled.

    from research import predict, training
    run = training.restore("runs/nmt_dates-20261126-120000")
    predict.translate(run, ["14 janvier 2024", "2024年1月14日"]).outputs

  nmt_dates          translate(run, texts, beam_size=1, attention=True) -> Translations
                     (outputs, tokens, the attention [T, S] of each text, beam scores)
  char_lm            sample(run, prompt, length=..., temperature, top_k) -> [bytes];
                     bits_per_byte(run, text), byte_bits(run, text) [N]
  listops            classify(run, expressions, attention=True) -> Classifications (labels,
                     probabilities, the attention [B, H, S, S] of each layer)
  mqar               recall(run, inputs, positions, attention=True) -> Recalls (the next
                     token at each position, its probability, the attention [B, H, L, L] of
                     each layer)
  sequence_tasks     predict_sequences(run, inputs) -> SequencePredictions
  kernel_regression  regress(run, x, weights=True) -> {kernel: Regression (estimates [N],
                     weights [N, n])}

Input the run's model cannot take is refused with one research.errors.InputError naming the
offending part and what the model takes, before anything compiles. The rules every predictor
keeps (research/predict/runs.py):

  - Inputs are any iterable (a list, a tuple, a generator, a numpy array), read once into a
    list, so an answer and the inputs it names agree; one str or bytes given instead of a
    list of them, or a value that is not iterable, is refused.
  - Sizes and seeds are ints (a bool is not) within a stated range, the range in the
    refusal: char_lm's length × num_samples and seed (0 … 2^32 − 1), nmt_dates' beam_size
    (at most the target vocabulary's size). No OverflowError or MemoryError reaches you.
  - Many inputs (10^6 texts, expressions, sequences or points; a text of 10^7 bytes) go
    through the compiled function in batches of at most config.train.batch_size rows
    (kernel_regression: runs.MAX_ROWS points), fewer where a call's outputs would pass
    runs.CALL_BYTES (256 MiB), the last batch padded to the same shape; the answers are
    gathered on the host. Memory on the device does not grow with the number of inputs.
  - Per-input outputs that grow with the square of an input (attention weights) or with the
    training set (kernel weights) are refused up front beyond runs.RESULT_BYTES (2 GiB) in
    all, naming the argument that leaves them out (attention=False, weights=False).
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
