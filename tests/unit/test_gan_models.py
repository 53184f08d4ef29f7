"""DCGAN models: shapes, initialisation, the BN-free switch, specs and state <-> numpy."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from thrift_trainer.training.models.gan_models import (
    GAN_MODELS,
    GanSpec,
    build_gan,
    gan_spec,
    gradients_to_numpy,
    numpy_to_gradients,
    numpy_to_state,
    sample_images,
    state_to_numpy,
)

torch.set_num_threads(1)

ALL_VARIANTS = [(name, bn) for name in GAN_MODELS for bn in (True, False)]


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def batchnorms(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def trained_a_little(spec: GanSpec, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """A pair whose BN running statistics and counters moved away from their defaults."""
    g, d = build_gan(spec, seed)
    with torch.no_grad():
        for _ in range(3):
            d(g(torch.randn(6, spec.z_dim)))
    return g, d


@pytest.mark.parametrize("name, batchnorm", ALL_VARIANTS)
def test_output_shapes(name, batchnorm):
    spec = gan_spec(name, batchnorm)
    g, d = build_gan(spec)
    images = g(torch.randn(3, spec.z_dim))
    assert images.shape == (3, *spec.image_shape)
    assert images.abs().max() <= 1.0
    assert d(images).shape == (3,)


def conv(c_in: int, c_out: int, bias: bool = True) -> int:
    """Parameters of a 4x4 convolution or transposed convolution."""
    return c_in * c_out * 4 * 4 + (c_out if bias else 0)


def linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def batchnorm(channels: int) -> int:
    return 2 * channels  # a scale and a shift per channel


def dcgan28_sizes(z: int, w: int) -> tuple[int, int]:
    """From the layers gan_models' docstring lists: G is Linear(z -> 2w*7*7) + BN,
    ConvT(2w -> w) + BN, ConvT(w -> 1); D is Conv(1 -> w), Conv(w -> 2w) + BN,
    Linear(2w*7*7 -> 1)."""
    g = linear(z, 2 * w * 49) + batchnorm(2 * w * 49) + conv(2 * w, w) + batchnorm(w) \
        + conv(w, 1)
    d = conv(1, w) + conv(w, 2 * w) + batchnorm(2 * w) + linear(2 * w * 49, 1)
    return g, d


@pytest.mark.parametrize("name, z, w", [("dcgan28", 64, 32), ("dcgan28-tiny", 8, 4)])
def test_dcgan28_size_follows_from_its_layers(name, z, w):
    g, d = build_gan(gan_spec(name))
    assert (n_params(g), n_params(d)) == dcgan28_sizes(z, w)
    if name == "dcgan28":
        assert dcgan28_sizes(z, w) == (243_489, 36_641)  # the docstring's 243k and 37k


def test_mlpgan28_has_the_papers_size():
    # The MD-GAN paper counts 716,560 parameters for its MNIST MLP G and 670,219 for its
    # ACGAN D with 11 outputs; ours has one logit, so 10 x 513 fewer.
    g, d = build_gan(gan_spec("mlpgan28", batchnorm=False))
    assert (n_params(g), n_params(d)) == (716_560, 670_219 - 10 * 513)
    tiny_g, tiny_d = build_gan(gan_spec("mlpgan28-tiny"))
    assert n_params(tiny_g) < 20_000 and n_params(tiny_d) < 20_000


def test_dcgan64_has_the_classic_size():
    # Radford et al.'s DCGAN (z 100, width 64); convolutions followed by BN have no bias.
    # pytorch/examples' dcgan counts 3,576,704 and 2,765,568: it also drops the biases
    # of G's last layer (3) and of D's first and last layers (64 + 1), which ours keep.
    z, w = 100, 64
    g_convs = [(z, 8 * w), (8 * w, 4 * w), (4 * w, 2 * w), (2 * w, w)]
    g_size = sum(conv(a, b, bias=False) + batchnorm(b) for a, b in g_convs) + conv(w, 3)
    d_convs = [(w, 2 * w), (2 * w, 4 * w), (4 * w, 8 * w)]
    d_size = conv(3, w) + sum(conv(a, b, bias=False) + batchnorm(b) for a, b in d_convs) \
        + conv(8 * w, 1)
    assert (g_size, d_size) == (3_576_704 + 3, 2_765_568 + 65)
    g, d = build_gan(gan_spec("dcgan64"))
    assert (n_params(g), n_params(d)) == (g_size, d_size)


def test_init_statistics():
    g, d = build_gan(gan_spec("dcgan28"))
    for module in (g, d):
        for layer in module.modules():
            if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                if layer.weight.numel() >= 10_000:
                    assert abs(layer.weight.mean().item()) < 2e-3
                    assert layer.weight.std().item() == pytest.approx(0.02, rel=0.05)
                assert layer.bias is None or not layer.bias.any()
    for bn in batchnorms(g) + batchnorms(d):
        assert bn.weight.mean().item() == pytest.approx(1.0, abs=0.01)
        assert bn.weight.std().item() == pytest.approx(0.02, rel=0.2)
        assert not bn.bias.any()


@pytest.mark.parametrize("name", GAN_MODELS)
def test_batchnorm_switch(name):
    with_bn, without_bn = build_gan(gan_spec(name)), build_gan(gan_spec(name, batchnorm=False))
    assert all(batchnorms(m) for m in with_bn)
    assert not any(batchnorms(m) for m in without_bn)


def test_same_seed_same_model_and_global_rng_untouched():
    spec = gan_spec("dcgan28-tiny")
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first, second = build_gan(spec, seed=5), build_gan(spec, seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    for a, b in zip(first, second, strict=True):
        assert all(torch.equal(x, y) for x, y in
                   zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    other_g, _ = build_gan(spec, seed=6)
    assert not torch.equal(other_g.project[0].weight, first[0].project[0].weight)


def test_spec_json_round_trip():
    spec = gan_spec("dcgan64-tiny", batchnorm=False)
    assert GanSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert GanSpec.from_dict({"arch": "dcgan28", "z_dim": 4, "width": 2}).batchnorm is True


@pytest.mark.parametrize("data, problem", [
    ({"arch": "dcgan28", "z_dim": 4, "width": 2, "depth": 3}, "unknown GanSpec key 'depth'"),
    ({"arch": "dcgan28", "z_dim": 4}, "'width' is missing"),
    ({"arch": "dcgan32", "z_dim": 4, "width": 2}, "GanSpec.arch"),
    ({"arch": "dcgan28", "z_dim": 0, "width": 2}, "GanSpec.z_dim"),
    ({"arch": "dcgan28", "z_dim": 4, "width": 2.0}, "GanSpec.width"),
    ({"arch": "dcgan28", "z_dim": 4, "width": 2, "batchnorm": 1}, "GanSpec.batchnorm"),
])
def test_bad_specs_are_named(data, problem):
    with pytest.raises(ValueError, match=problem):
        GanSpec.from_dict(data)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown GAN model 'dcgan'.*dcgan28-tiny"):
        gan_spec("dcgan")


@pytest.mark.parametrize("name", ["dcgan28-tiny", "dcgan64-tiny"])
def test_state_numpy_round_trip_is_bit_exact(name):
    spec = gan_spec(name)
    source_g, source_d = trained_a_little(spec, seed=1)
    target_g, target_d = build_gan(spec, seed=2)
    arrays = {**state_to_numpy(source_g, "G."), **state_to_numpy(source_d, "D.")}
    assert list(arrays) == ([f"G.{k}" for k in source_g.state_dict()]
                            + [f"D.{k}" for k in source_d.state_dict()])
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays.values())
    params_before = list(target_g.parameters())
    numpy_to_state(target_g, arrays, "G.")
    numpy_to_state(target_d, arrays, "D.")
    assert list(target_g.parameters()) == params_before  # updated in place
    for source, target in ((source_g, target_g), (source_d, target_d)):
        for (key, a), b in zip(source.state_dict().items(), target.state_dict().values(),
                               strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), key
    assert all(bn.num_batches_tracked.item() == 3 for bn in batchnorms(target_g))


def test_state_arrays_are_copies():
    g, _ = build_gan(gan_spec("dcgan28-tiny"))
    arrays = state_to_numpy(g)
    arrays["project.0.weight"][...] = 7.0
    assert not (g.project[0].weight == 7.0).any()
    numpy_to_state(g, arrays)
    arrays["project.0.weight"][...] = 9.0
    assert (g.project[0].weight == 7.0).all()


def test_state_loads_from_read_only_and_strided_arrays_without_warnings():
    """Weights decoded from a message are read-only views; a checkpoint's may be any layout."""
    source, _ = build_gan(gan_spec("dcgan28-tiny"), seed=1)
    target, _ = build_gan(gan_spec("dcgan28-tiny"), seed=2)
    arrays = state_to_numpy(source)
    for name, value in list(arrays.items()):
        if value.ndim == 2:
            value = np.asfortranarray(value)
        value.flags.writeable = False
        arrays[name] = value
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        numpy_to_state(target, arrays)
    for (key, a), b in zip(source.state_dict().items(), target.state_dict().values(),
                           strict=True):
        assert torch.equal(a, b), key


def test_state_names_and_shapes_are_checked():
    g, _ = build_gan(gan_spec("dcgan28-tiny"))
    arrays = state_to_numpy(g)
    missing = {k: v for k, v in arrays.items() if k != "project.1.running_mean"}
    with pytest.raises(ValueError, match="missing project.1.running_mean"):
        numpy_to_state(g, missing)
    with pytest.raises(ValueError, match="unexpected extra"):
        numpy_to_state(g, {**arrays, "extra": np.zeros(1, np.float32)})
    arrays["project.0.weight"][...] = 5.0
    arrays["upsample.3.bias"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="upsample.3.bias: shape"):
        numpy_to_state(g, arrays)
    assert not (g.project[0].weight == 5.0).any()  # nothing was copied


def test_gradients_round_trip():
    spec = gan_spec("dcgan28-tiny", batchnorm=False)
    g, d = build_gan(spec)
    d(g(torch.randn(4, spec.z_dim))).mean().backward()
    grads = gradients_to_numpy(d, "D.")
    assert list(grads) == [f"D.{k}" for k, _ in d.named_parameters()]
    _, fresh = build_gan(spec, seed=3)
    numpy_to_gradients(fresh, grads, "D.")
    for (_, a), (_, b) in zip(d.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    untouched = gradients_to_numpy(build_gan(spec)[1])
    assert all(not a.any() for a in untouched.values())
    with pytest.raises(ValueError, match="missing"):
        numpy_to_gradients(fresh, {})


def test_gradients_set_again_are_written_over_with_a_fresh_gradients_bits():
    spec = gan_spec("dcgan28-tiny", batchnorm=False)
    _, d = build_gan(spec)
    rng = np.random.default_rng(1)
    first, second = ({f"D.{k}": rng.normal(size=tuple(p.shape)) for k, p in d.named_parameters()}
                     for _ in range(2))
    numpy_to_gradients(d, first, "D.")
    held = {k: p.grad for k, p in d.named_parameters()}
    numpy_to_gradients(d, second, "D.")  # float64 arrays, rounded to float32
    for k, p in d.named_parameters():
        assert p.grad is held[k]  # no new tensor a step
        assert p.grad.numpy().tobytes() == second[f"D.{k}"].astype(np.float32).tobytes()


def test_sample_images_uses_eval_mode_and_restores_training():
    g, _ = trained_a_little(gan_spec("dcgan28-tiny"))
    g.train()
    first = sample_images(g, 7, seed=4, batch_size=3)
    assert first.shape == (7, 1, 28, 28) and g.training
    assert torch.equal(first, sample_images(g, 7, seed=4, batch_size=3))
    assert torch.allclose(first, sample_images(g, 7, seed=4), atol=1e-6)
    g.eval()
    with torch.no_grad():
        expected = g(torch.randn(7, g.z_dim, generator=torch.Generator().manual_seed(4)))
    assert torch.allclose(first, expected, atol=1e-6)
    assert not g.training
