"""TensorBoard scalar events, written directly: no TensorFlow, no tensorboardX (which imports
torch where it is installed, two seconds at every start).

An event file is a sequence of TFRecords, each

  uint64 length | uint32 masked CRC-32C of length | data | uint32 masked CRC-32C of data

(little endian; masked crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8), whose data is a
serialised `tensorflow.Event` protocol buffer. The fields used here:

  Event       wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
              summary = 5 (Summary), session_log = 7 (SessionLog)
  Summary     value = 1 (repeated Value)
  Value       tag = 1 (string), simple_value = 2 (float)
  SessionLog  status = 1 (enum; START = 1)

A START session log at step s tells TensorBoard to drop the events at steps >= s that an
earlier writer of the run left (a resumed run's purge).
"""

import os
import socket
import struct
import time


def _crc32c_table() -> tuple[int, ...]:
  """Byte-at-a-time table of the reflected Castagnoli polynomial 0x82F63B78."""
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli), as TFRecord frames use it."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
  value &= (1 << 64) - 1            # int64 as protobuf encodes it
  out = bytearray()
  while True:
    bits, value = value & 0x7F, value >> 7
    out.append(bits | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
  key = _varint(number << 3 | wire_type)
  return key + (_varint(len(payload)) + payload if wire_type == 2 else payload)


def _event(step: int, *fields: bytes) -> bytes:
  return (_field(1, 1, struct.pack("<d", time.time())) + _field(2, 0, _varint(step))
          + b"".join(fields))


def _record(data: bytes) -> bytes:
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", _masked_crc(length)) + data
          + struct.pack("<I", _masked_crc(data)))


class EventWriter:
  """Appends scalar summaries to a new event file in `logdir`."""

  def __init__(self, logdir: str, purge_step: int | None = None):
    os.makedirs(logdir, exist_ok=True)
    self.logdir = logdir
    self.path = os.path.join(logdir, f"events.out.tfevents.{time.time():.0f}."
                                     f"{socket.gethostname()}.{os.getpid()}")
    self.file = open(self.path, "ab")
    self._write(_event(0, _field(3, 2, b"brain.Event:2")))
    if purge_step is not None:
      self._write(_event(purge_step, _field(7, 2, _field(1, 0, _varint(1)))))

  def _write(self, event: bytes) -> None:
    self.file.write(_record(event))

  def scalars(self, step: int, values: dict[str, float]) -> None:
    """One event holding every value at `step`, flushed to disk."""
    summary = b"".join(_field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack(
        "<f", value))) for tag, value in values.items())
    self._write(_event(step, _field(5, 2, summary)))
    self.file.flush()

  def close(self) -> None:
    self.file.close()
