#!/usr/bin/env python3
"""Writes the seed files of the .npy fuzz corpus (tests/npy_corpus/), small valid and invalid files.

Files named ok_* must be read; files named bad_* must be refused with an InputError. The fuzz
tests (tests/fuzz/) start from them and mutate them; the seeded loop also checks these two
expectations. The files are committed; run this script only to change them:

    /usr/bin/python3 tests/npy_corpus/make_corpus.py tests/npy_corpus   # Debian's python3-numpy
"""
import io
import pathlib
import struct
import sys

import numpy as np


def npy(array, version=(1, 0)):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def raw(header, data=b"", version=1, header_len=None):
    """A file with a hand-written header dict; header_len overrides the stored length."""
    text = header.encode("latin1")
    pre = 10 if version == 1 else 12
    text += b" " * ((64 - (pre + len(text) + 1) % 64) % 64) + b"\n"
    n = len(text) if header_len is None else header_len
    size = struct.pack("<H", n) if version == 1 else struct.pack("<I", n)
    return b"\x93NUMPY" + bytes([version, 0]) + size + text + data


def main(out):
    out = pathlib.Path(out)
    rng = np.random.default_rng(7)
    f4 = rng.standard_normal((1, 2, 3, 4)).astype("<f4")
    files = {
        "ok_f4_v1.npy": npy(f4),
        "ok_f4_v2.npy": npy(f4, (2, 0)),
        "ok_f4_v3.npy": npy(f4, (3, 0)),
        "ok_f2_v1.npy": npy(rng.standard_normal((2, 3)).astype("<f2")),
        "ok_f2_specials.npy": npy(np.array([0.0, -0.0, 6e-8, 65504, np.inf, -np.inf, np.nan], dtype="<f2")),
        "ok_f4_1d.npy": npy(np.arange(1, 6, dtype="<f4")),
        "ok_f4_scalar.npy": npy(np.array(2.5, dtype="<f4")),
        "ok_f4_empty.npy": npy(np.zeros((0, 3), dtype="<f4")),
        "ok_long_suffix.npy": raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 1L), }", b"\0" * 8),
        "bad_magic.npy": b"\x93NUMPZ\x01\x00" + npy(f4)[8:],
        "bad_version.npy": b"\x93NUMPY\x09\x00" + npy(f4)[8:],
        "bad_empty.npy": b"",
        "bad_preamble_only.npy": b"\x93NUMPY\x02\x00\x10",
        "bad_truncated_header.npy": npy(f4)[:40],
        "bad_truncated_data.npy": npy(f4)[:-5],
        "bad_header_len_lies.npy": raw("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4,
                                       header_len=60000),
        "bad_header_len_huge_v2.npy": raw("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4,
                                          version=2, header_len=0xFFFFFFF0),
        "bad_huge_shape.npy": raw("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                  "(999999999999999, 999999999999999, 999999999999999), }", b"\0" * 16),
        "bad_shape_overflow.npy": raw("{'descr': '<f2', 'fortran_order': False, 'shape': (4611686018427387904,), }"),
        "bad_negative_shape.npy": raw("{'descr': '<f4', 'fortran_order': False, 'shape': (-3, 2), }", b"\0" * 24),
        "bad_shape_not_tuple.npy": raw("{'descr': '<f4', 'fortran_order': False, 'shape': [3], }", b"\0" * 12),
        "bad_shape_open.npy": raw("{'descr': '<f4', 'fortran_order': False, 'shape': (3, ", b"\0" * 12),
        "bad_fortran.npy": npy(np.asfortranarray(rng.standard_normal((3, 2)).astype("<f4"))),
        "bad_descr_f8.npy": npy(rng.standard_normal((2, 2))),
        "bad_descr_i4.npy": npy(np.arange(4, dtype="<i4")),
        "bad_descr_big_endian.npy": npy(np.arange(4, dtype=">f4")),
        "bad_descr_unclosed.npy": raw("{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }", b"\0" * 4),
        "bad_no_descr.npy": raw("{'fortran_order': False, 'shape': (1,), }", b"\0" * 4),
        "bad_binary_header.npy": raw("{'descr': \x01\x02\xff\xfe, 'shape': (1,), }", b"\0" * 4),
    }
    for name, data in files.items():
        (out / name).write_bytes(data)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent)
