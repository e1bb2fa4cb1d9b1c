"""The unit tier's rule holds (tests/unit/conftest.py): here importing torch and starting a process
are refused, with a message that says where such a test goes."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess

import pytest


def test_importing_torch_is_refused():
    # a submodule no test imports: refused by the rule even where another tier imported torch before
    with pytest.raises(ImportError, match="refused: tests/unit/ is for tests without torch.*tests/e2e/"):
        importlib.import_module("torch.a_module_of_torch")


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run(["true"]),
        lambda: os.system("true"),
        lambda: multiprocessing.get_context("spawn").Process(target=int).start(),
    ],
    ids=["subprocess", "os.system", "multiprocessing"],
)
def test_starting_a_process_is_refused(start):
    with pytest.raises(RuntimeError, match="a process was started: .*tests/e2e/"):
        start()
