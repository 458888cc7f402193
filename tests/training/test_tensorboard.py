"""Our TensorBoard event files, read back with tensorboardX's protocol buffers and CRC."""

import struct

import numpy as np
import pytest
from tensorboardX.crc32c import crc32c as reference_crc32c
from tensorboardX.proto.event_pb2 import Event

from research.training.tensorboard import EventWriter, crc32c


def _records(path) -> list[bytes]:
  """The data of every TFRecord in `path`, checking both masked CRCs of each."""
  mask = lambda crc: (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
  data, records, at = open(path, "rb").read(), [], 0
  while at < len(data):
    (length,), (length_crc,) = struct.unpack_from("<Q", data, at), struct.unpack_from(
        "<I", data, at + 8)
    assert length_crc == mask(reference_crc32c(data[at:at + 8]))
    payload = data[at + 12:at + 12 + length]
    assert struct.unpack_from("<I", data, at + 12 + length)[0] == mask(reference_crc32c(payload))
    records.append(payload)
    at += 16 + length
  return records


@pytest.mark.parametrize("data", [b"", b"a", b"123456789", bytes(range(256)) * 3])
def test_crc32c_matches_the_reference(data):
  assert crc32c(data) == reference_crc32c(data)


def test_scalars_and_purge_read_back_as_tensorflow_events(tmp_path):
  writer = EventWriter(str(tmp_path), purge_step=41)
  writer.scalars(50, {"train/loss": 0.25, "train/grad_norm": 3.5e-7})
  writer.scalars(2**40, {"eval/accuracy": 1.0})
  writer.close()
  (path,) = tmp_path.iterdir()
  assert path.name.startswith("events.out.tfevents.")
  first, purge, *scalars = [Event.FromString(r) for r in _records(path)]
  assert first.file_version == "brain.Event:2" and first.wall_time > 1.7e9
  assert purge.step == 41 and purge.session_log.status == purge.session_log.START
  assert [(e.step, [(v.tag, v.simple_value) for v in e.summary.value]) for e in scalars] == [
      (50, [("train/loss", 0.25), ("train/grad_norm", np.float32(3.5e-7))]),
      (2**40, [("eval/accuracy", 1.0)])]
