"""The other half of the file-fault matrix (tests/test_file_faults.py says what each cell holds): every other file of
the layout (file_faults.cells), in a test file of its own so that `make test`'s two workers (--dist loadfile) share the matrix."""

from __future__ import annotations


import pytest

import file_faults as ff

pytest.importorskip("ansible_runner")  # fleet resume reads its inventory through Ansible


@pytest.mark.parametrize("f, state, command, verb, scope", ff.cells(1))
def test_cell(every_file, tmp_path, f, state, command, verb, scope):
    ff.hold(every_file, tmp_path, f, state, command, verb, scope)
