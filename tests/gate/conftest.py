"""The gate tests' temporary folders under pytest's own: a failed gate run keeps its folder for
the log its error names (`workflows._workdir`), which the planted failures here would otherwise
leave in /tmp, one per run of the suite."""

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _temp_under_pytest(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("gate-tmp")))
