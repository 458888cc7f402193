"""Interleaved timing shared by the benchmarks: noise hits every peer alike."""

import statistics
import time


def median_ms(fns: dict, repeats: int, pause: float) -> dict:
  """Round-robin timing: every fn runs once per round; median milliseconds over rounds.

  Each fn is called twice first (compilation, warm-up). `pause` seconds of sleep before
  each timed call let the previous peer's threads go idle (torch's OpenMP workers spin
  after a call and would slow whatever runs next).
  """
  for fn in fns.values():
    fn()
    fn()
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      time.sleep(pause)
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
