"""train.fine_tune -> the fits of a run: which epochs, what trains, at which learning rate."""

from __future__ import annotations

from tfmlops.config import config_from_dict
from tfmlops.model.fitting import Phase, phases


def cfg_of(backbone="mobilenet_v3_small", weights="imagenet", epochs=10, **fine_tune):
    return config_from_dict({"model": {"backbone": backbone, "backbone_weights": weights},
                             "train": {"epochs": epochs, "fine_tune": fine_tune}})


def test_a_pretrained_backbone_trains_its_head_then_its_top_layers():
    plan = phases(cfg_of(head_epochs=3, unfreeze=20, lr_factor=0.05))
    assert plan == [Phase(1, 0, 3, 0), Phase(2, 3, 10, 20, 0.05)]


def test_one_phase_without_a_pretrained_backbone_or_when_disabled():
    whole = [Phase(1, 0, 10, None)]
    assert phases(cfg_of(backbone="none", weights=None)) == whole
    assert phases(cfg_of(weights=None)) == whole  # random init: nothing to keep frozen
    assert phases(cfg_of(enabled=False)) == whole


def test_head_epochs_at_or_beyond_the_run_leave_one_frozen_phase():
    assert phases(cfg_of(head_epochs=10)) == [Phase(1, 0, 10, 0)]
    assert phases(cfg_of(head_epochs=20)) == [Phase(1, 0, 10, 0)]
    assert phases(cfg_of(head_epochs=0, unfreeze=0.5)) == [Phase(2, 0, 10, 0.5, 0.1)]
    # a tune trial's own epochs
    assert phases(cfg_of(head_epochs=2), epochs=3) == [Phase(1, 0, 2, 0), Phase(2, 2, 3, 0.25, 0.1)]
