"""Tests of the build's SASS check without a GPU: a made-up `cuobjdump -sass` listing, one kernel
instance whose every HGMMA waits (gsb0: a serialized wgmma pipeline) and one pipelined, read by
runner.sass_counts() and judged by runner.sass_check() through a fake cuobjdump.

    python3 -m unittest discover -s bench/session -p 'test_*.py'     (from the repository root; CTest runs it)
"""
import os
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: the package `session`

from session import runner  # noqa: E402

SASS = """\
        Function : _Z10serializedv
        /*0000*/                   MOV R1, c[0x0][0x28] ;                   /* 0x00000a0000017a02 */
                                                                             /* 0x000fe40000000f00 */
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0030*/               @!P0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   UMOV UR4, 0x1 ;
        /*0060*/                   R2UR UR5, R2 ;
        /*0070*/                   STL [R1], R3 ;
        Function : _Z9pipelinedv
        /*0000*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
"""


class SassCheck(unittest.TestCase):
    def test_counts_per_instance(self):
        rows = runner.sass_counts(SASS.splitlines())
        # name, uniform, R2UR, spills, instructions, HGMMA, with gsb0, WARPGROUP.DEPBAR
        self.assertEqual(rows, [["_Z10serializedv", 1, 1, 1, 8, 3, 3, 1], ["_Z9pipelinedv", 0, 0, 0, 3, 3, 1, 0]])

    def test_a_serialized_instance_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake = os.path.join(tmp, "cuobjdump")
            with open(os.path.join(tmp, "sass.txt"), "w") as f:
                f.write(SASS)
            with open(fake, "w") as f:
                f.write(f"#!/bin/sh\ncat {tmp}/sass.txt\n")
            os.chmod(fake, 0o755)
            exe = os.path.join(tmp, "stage11_hopper_kernel")
            with open(exe, "w") as f:
                f.write("")
            os.chmod(exe, 0o755)
            table = os.path.join(tmp, "wgmma_sass.txt")
            with mock.patch.dict(os.environ, {"PATH": tmp + os.pathsep + os.environ.get("PATH", "")}):
                lines, serialized = runner.sass_check(exe, table)
            self.assertEqual(len(serialized), 1)
            self.assertTrue(serialized[0].startswith("serialized() 1 1 1 8 3 3 1")
                            or serialized[0].startswith("_Z10serializedv 1 1 1 8 3 3 1"), serialized)
            self.assertIn("2 kernel instances; 1 with every HGMMA waited for", lines[0])
            with open(table) as f:
                self.assertEqual(len(f.read().splitlines()), 2)

    def test_nothing_to_check(self):
        self.assertEqual(runner.sass_check("/nonexistent/stage11_hopper_kernel", "/nonexistent/t.txt"), ([], []))


if __name__ == "__main__":
    unittest.main()
