"""Interleaved timing shared by the benchmarks: noise hits every peer alike."""

import random
import statistics
import time


def median_ms(fns: dict, repeats: int, pause: float) -> dict:
  """Round-robin timing: every fn runs once per round; median milliseconds over rounds.

  Each fn is called twice first (compilation, warm-up). Each round runs the fns in an order
  of its own (a shuffle seeded alike in every run), so that what one call leaves behind
  (threads still spinning, caches filled) does not always fall on the same peer. `pause`
  seconds of sleep before each timed call let the previous peer's threads go idle (torch's
  OpenMP workers spin after a call and would slow whatever runs next).
  """
  for fn in fns.values():
    fn()
    fn()
  times = {name: [] for name in fns}
  order, shuffle = list(fns), random.Random(0).shuffle
  for _ in range(repeats):
    shuffle(order)
    for name in order:
      fn = fns[name]
      time.sleep(pause)
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
