"""The public package a plug-in author writes against: every advertised name is there."""

from __future__ import annotations

import re

import pytest

import thrift_trainer as tt
from thrift_trainer import _EXPORTS, _SUBMODULES


def test_every_public_name_resolves_to_what_the_trainer_uses() -> None:
    assert set(tt.__all__) == {*_EXPORTS, *_SUBMODULES, "__version__"}
    for name in tt.__all__:
        assert getattr(tt, name) is not None, name
    from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
    from thrift_trainer.training.codecs import Codec

    assert tt.Codec is Codec and tt.algorithms.DeltaAveraging is DeltaAveraging
    assert issubclass(tt.algorithms.DeltaAveraging, tt.AveragingAlgorithm)
    assert dir(tt) == sorted(tt.__all__)


def test_the_version_is_a_release_number_and_unknown_names_are_refused() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", tt.__version__)
    with pytest.raises(AttributeError, match="has no attribute 'Model'"):
        tt.Model  # noqa: B018
