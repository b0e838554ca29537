"""The collection order conftest.py sets: the launcher group (the longest serial chain) first."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_the_launcher_group_is_collected_first(pytester: pytest.Pytester) -> None:
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).parent / "conftest.py", pytester.path / "conftest.py")
    shutil.copy(Path(__file__).parent / "builders.py", pytester.path / "builders.py")
    pytester.makeini("[pytest]\nmarkers =\n    launcher: real jobs\n    browser: chromium\n    hta: hta\n")
    pytester.makepyfile(
        test_a="def test_one(): pass\ndef test_two(): pass\n",
        test_capture_launch="def test_job(): pass\n",
        test_z="import pytest\n\n@pytest.mark.launcher\ndef test_marked(): pass\ndef test_plain(): pass\n",
    )
    # in a process of its own: this one has imported the real test_capture_launch already
    result = pytester.runpytest_subprocess("-p", "no:xdist", "--collect-only", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert ids == [
        "test_capture_launch.py::test_job",
        "test_z.py::test_marked",
        "test_a.py::test_one",
        "test_a.py::test_two",
        "test_z.py::test_plain",
    ], result.outlines
