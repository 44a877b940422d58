"""Malformed refs pickles end in the loader's error naming the file, whatever the unpickler raised inside."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tests.datasets import fixtures
from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.datasets.refer import load_refer
from vrh_interp.data.datasets.safe_pickle import load_plain_pickle

# each makes the unpickler itself fail with the named exception (checked below against a plain pickle.loads)
MALFORMED = {
    "AttributeError": b"\x80\x02K\x01K\x02a.",  # APPEND onto an int
    "TypeError": b"\x80\x02}]K\x01s.",  # a list as a dict key
    "IndexError": b"\x80\x02]K\x01K\x02s.",  # SETITEM onto a list
    "MemoryError": b"\x80\x02\x8e" + (2 ** 62).to_bytes(8, "little") + b"x",  # BINBYTES8 claiming 4 EiB
    "UnpicklingError": b"\x80\x02h\x05.",  # a memo entry that was never stored
    "EOFError": b"",
}


@pytest.mark.parametrize("raised", sorted(MALFORMED))
def test_malformed_refs_pickle_is_the_loaders_error_naming_the_file(tmp_path: Path, raised: str) -> None:
    data = MALFORMED[raised]
    with pytest.raises(BaseException) as plain:  # what the stock unpickler raises on these bytes
        pickle.loads(data)
    assert type(plain.value).__name__ == raised
    fixtures.write_refer(tmp_path)
    refs = tmp_path / "refcoco" / "refs(unc).p"
    refs.write_bytes(data)
    with pytest.raises(pickle.UnpicklingError, match=rf"{raised}") as direct:
        load_plain_pickle(refs)
    assert str(direct.value).startswith(f"{refs}: not a readable pickle")
    with pytest.raises(DatasetError) as loader:
        load_refer(tmp_path, "refcoco", "val")
    assert loader.value.where == str(refs) and f"not a readable pickle ({raised}" in str(loader.value)
