import pytest

from app.errors import SpecdeckError
from app.units import parse_size


@pytest.mark.parametrize("text, n", [("24GiB", 24 * 2**30), ("24G", 24 * 2**30), ("23.5GB", 23_500_000_000),
                                     ("512MiB", 512 * 2**20), ("2000000000", 2_000_000_000)])
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["abc", "24XB", "-1G", "0", "24"])
def test_bad_sizes(text):
    with pytest.raises(SpecdeckError):
        parse_size(text)
