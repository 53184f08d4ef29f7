"""The MLP maths, the server optimizers and the in-process delta averaging.

The vectorised code is checked three ways: against a slow per-row transcription of the
reference library's description, against finite differences, and against the reference's
published validation errors on the shipped data.
"""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from thrift_trainer.training.baselines.simulate import run_delta_averaging
from thrift_trainer.training.models.mlp import (
    LocalTraining,
    MLPSpec,
    evaluate,
    forward,
    init_params,
    predict,
    train_local,
)
from thrift_trainer.training.server_optim import make_server_optimizer, weighted_average

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "letters"

# --------------------------------------------------------------- slow loop-based reference

REPO = Path(__file__).resolve().parents[2]
_script = importlib.util.spec_from_file_location(
    "simulate_letters", REPO / "scripts" / "simulate_letters.py")
simulate = importlib.util.module_from_spec(_script)
_script.loader.exec_module(simulate)


def loop_forward_row(W, V, x, relu):
    """One row through the net, element by element: (pre-activations, [1, h], probabilities)."""
    x1 = [1.0, *x]
    a = [sum(x1[k] * W[k, j] for k in range(len(x1))) for j in range(W.shape[1])]
    z = [1.0] + [max(aj, 0.0) if relu else aj for aj in a]
    o = [sum(z[j] * V[j, c] for j in range(len(z))) for c in range(V.shape[1])]
    top = max(o)
    e = [math.exp(oc - top) for oc in o]
    return a, z, [ec / sum(e) for ec in e]


def loop_train(W, V, X, y, eta, epochs, relu):
    """The README's train(eta, epochs), one row and one weight at a time.

    dV = eta * Z^T (R - Y), dW = eta * X1^T [((R - Y) V[1:]^T) * mask], applied as W -= dW;
    the compat run (relu=False) stops once the summed loss moves by at most 0.2.
    Returns (W, V, epochs run).
    """
    W, V = W.copy(), V.copy()
    previous = None
    for epoch in range(epochs):
        dW, dV, loss = np.zeros_like(W), np.zeros_like(V), 0.0
        for x, label in zip(X, y, strict=True):
            a, z, r = loop_forward_row(W, V, x, relu)
            loss -= math.log(r[label] + 1e-6)
            err = [r[c] - (1.0 if c == label else 0.0) for c in range(len(r))]
            for j in range(len(z)):
                for c in range(len(err)):
                    dV[j, c] += eta * z[j] * err[c]
            for j in range(len(a)):
                back = sum(err[c] * V[j + 1, c] for c in range(len(err)))
                if (a[j] > 0) if relu else (a[j] >= 0):
                    for k, xk in enumerate([1.0, *x]):
                        dW[k, j] += eta * xk * back
        if not relu and previous is not None and abs(loss - previous) <= 0.2:
            return W, V, epoch
        previous = loss
        W -= dW
        V -= dV
    return W, V, epochs


@pytest.fixture
def small_problem():
    """12 rows of integer features 0..15, 5 classes, 6 hidden units, weights of both signs."""
    rng = np.random.RandomState(7)
    X = rng.randint(0, 16, size=(12, 16)).astype(np.float64)
    y = rng.randint(0, 5, size=12)
    params = {"W": rng.normal(0, 0.05, (17, 6)), "V": rng.normal(0, 0.05, (7, 5))}
    return X, y, params


@pytest.mark.parametrize("compat", [True, False])
def test_forward_matches_loop_reference(small_problem, compat):
    X, y, params = small_problem
    spec = MLPSpec(hidden=(6,), n_out=5, compat=compat)
    expected = [loop_forward_row(params["W"], params["V"], x, not compat)[2] for x in X]
    np.testing.assert_allclose(forward(params, X, spec), expected, rtol=0, atol=1e-12)
    error, loss = evaluate(params, X, y, spec)
    probs = np.array(expected)[np.arange(len(y)), y]
    assert loss == pytest.approx(-np.mean(np.log(probs + (1e-6 if compat else 0.0))), abs=1e-12)
    assert error == np.mean(predict(params, X, spec) != y)


@pytest.mark.parametrize(
    ("compat", "eta", "epochs_run"),
    [
        (True, 1e-2, 6),  # runs all 6 epochs
        (True, 3e-3, 3),  # the early stop fires at the top of epoch 4
        (True, 1e-4, 1),  # the loss barely moves: stops before the second update
        (False, 1e-3, 6),  # no early stop outside compat
    ],
)
def test_full_batch_training_matches_loop_reference(small_problem, compat, eta, epochs_run):
    X, y, params = small_problem
    spec = MLPSpec(hidden=(6,), n_out=5, compat=compat)
    pre = np.c_[np.ones(len(X)), X] @ params["W"]
    assert (pre > 0).any() and (pre < 0).any()  # the mask matters
    new, stats = train_local(params, X, y, spec, LocalTraining(epochs=6, eta=eta))
    W, V, loop_epochs = loop_train(params["W"], params["V"], X, y, eta, 6, relu=not compat)
    np.testing.assert_allclose(new["W"], W, rtol=0, atol=1e-10)
    np.testing.assert_allclose(new["V"], V, rtol=0, atol=1e-10)
    assert (stats.num_samples, stats.epochs_run) == (12, loop_epochs)
    assert loop_epochs == epochs_run


# ------------------------------------------------------------------- gradient checks


def deep_problem():
    rng = np.random.RandomState(3)
    spec = MLPSpec(n_in=4, hidden=(7, 5), n_out=3, scale_features=True)
    X = rng.uniform(0, 15, size=(9, 4))
    y = rng.randint(0, 3, size=9)
    return spec, init_params(spec, seed=5), X, y


def summed_loss(params, X, y, spec):
    return evaluate(params, X, y, spec)[1] * len(y)


def test_relu_gradient_matches_finite_differences():
    spec, params, X, y = deep_problem()
    assert set(params) == {"W", "W2", "V"}
    # One full-batch step with eta 1 is params - grad(summed loss).
    stepped, _ = train_local(params, X, y, spec, LocalTraining(epochs=1, eta=1.0))
    h = 1e-6
    for name, value in params.items():
        analytic = value - stepped[name]
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            shifted = {k: v.copy() for k, v in params.items()}
            shifted[name][index] += h
            up = summed_loss(shifted, X, y, spec)
            shifted[name][index] -= 2 * h
            numeric[index] = (up - summed_loss(shifted, X, y, spec)) / (2 * h)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_minibatch_optimizers_step_on_the_mean_gradient():
    spec, params, X, y = deep_problem()
    gd, _ = train_local(params, X, y, spec, LocalTraining(epochs=1, eta=1.0))
    grad = {name: (params[name] - gd[name]) / len(y) for name in params}
    sgd, _ = train_local(params, X, y, spec, LocalTraining(1, 0.1, "sgd", batch_size=100))
    adam, _ = train_local(params, X, y, spec, LocalTraining(1, 0.1, "adam", batch_size=100))
    for name in params:
        np.testing.assert_allclose(sgd[name], params[name] - 0.1 * grad[name], atol=1e-12)
        # Adam's first bias-corrected step is lr * g / (|g| + eps).
        first = 0.1 * grad[name] / (np.abs(grad[name]) + 1e-8)
        np.testing.assert_allclose(adam[name], params[name] - first, atol=1e-9)


def test_train_local_leaves_inputs_alone_and_reports_stats():
    spec, params, X, y = deep_problem()
    copies = ({k: v.copy() for k, v in params.items()}, X.copy(), y.copy())
    new, stats = train_local(params, X, y, spec, LocalTraining(3, 0.01, "adam", batch_size=4))
    for name in params:
        np.testing.assert_array_equal(params[name], copies[0][name])
        assert not np.shares_memory(new[name], params[name])
    np.testing.assert_array_equal(X, copies[1])
    np.testing.assert_array_equal(y, copies[2])
    assert (stats.error, stats.loss) == evaluate(new, X, y, spec)
    assert stats.loss < evaluate(params, X, y, spec)[1]


# ------------------------------------------------------------------ spec and init


def test_init_matches_the_seeded_global_generator_without_touching_it():
    state = np.random.get_state()
    try:
        np.random.seed(1)
        V = np.random.rand(21, 26) * 0.02 - 0.01
        W = np.random.rand(17, 20) * 0.02 - 0.01
        before = np.random.get_state()[1].copy()
        params = init_params(MLPSpec(compat=True), seed=1)
        np.testing.assert_array_equal(np.random.get_state()[1], before)
    finally:
        np.random.set_state(state)
    np.testing.assert_array_equal(params["W"], W)
    np.testing.assert_array_equal(params["V"], V)
    np.testing.assert_array_equal(init_params(MLPSpec(), seed=1)["W"], W)


def test_deep_init_shapes_and_he_scale():
    spec = MLPSpec(hidden=(256, 128, 64))
    params = init_params(spec)
    assert {k: v.shape for k, v in params.items()} == {
        "W": (17, 256),
        "W2": (257, 128),
        "W3": (129, 64),
        "V": (65, 26),
    }
    assert not params["W2"][0].any()  # zero biases
    assert np.abs(params["W2"]).max() <= math.sqrt(6 / 256)


def test_spec_dict_round_trip_and_rejections():
    spec = MLPSpec(hidden=(256, 256), scale_features=True)
    assert MLPSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["hidden"] == [256, 256]
    for bad, key in [
        ({"hiden": [2]}, "hiden"),
        ({"n_in": 16.0}, "n_in"),
        ({"compat": "yes"}, "compat"),
        ({"hidden": [20, "5"]}, "hidden"),
        ({"hidden": []}, "hidden"),
    ]:
        with pytest.raises(ValueError, match=key):
            MLPSpec.from_dict(bad)
    with pytest.raises(ValueError, match="scale_features"):
        MLPSpec(compat=True, scale_features=True)
    opt = LocalTraining(epochs=5, eta=1e-3, optimizer="adam")
    assert LocalTraining.from_dict(opt.to_dict()) == opt
    with pytest.raises(ValueError, match="'rmsprop' unknown"):
        LocalTraining(epochs=1, eta=0.1, optimizer="rmsprop")
    with pytest.raises(ValueError, match="gd"):
        train_local(
            init_params(MLPSpec(compat=True)),
            np.zeros((2, 16)),
            np.zeros(2, int),
            MLPSpec(compat=True),
            opt,
        )


# -------------------------------------------------------------- server optimizers


def delta_pair():
    rng = np.random.RandomState(0)
    weights = {"W": rng.normal(size=(3, 2)), "V": rng.normal(size=(3, 4))}
    delta = {"W": rng.normal(size=(3, 2)), "V": rng.normal(size=(3, 4))}
    return weights, delta


def test_avg_adds_the_delta_without_mutating():
    weights, delta = delta_pair()
    saved = {k: v.copy() for k, v in weights.items()}
    new = make_server_optimizer("avg").step(weights, delta)
    for name in weights:
        np.testing.assert_array_equal(new[name], saved[name] + delta[name])
        np.testing.assert_array_equal(weights[name], saved[name])


def test_momentum_accumulates():
    weights, delta = delta_pair()
    server = make_server_optimizer("momentum", lr=0.5, beta=0.9)
    once = server.step(weights, delta)
    twice = server.step(once, delta)
    np.testing.assert_allclose(twice["W"], weights["W"] + 0.5 * delta["W"] * (1 + 1.9))


@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_state_round_trips_through_savez(tmp_path, name):
    weights, delta = delta_pair()
    server = make_server_optimizer(name)
    weights = server.step(server.step(weights, delta), delta)
    np.savez(tmp_path / "state.npz", **server.state_dict())
    restored = make_server_optimizer(**{"name": name})
    with np.load(tmp_path / "state.npz") as saved:
        restored.load_state_dict(dict(saved))
    assert restored.steps == 2
    expected, actual = server.step(weights, delta), restored.step(weights, delta)
    for key in weights:
        np.testing.assert_array_equal(actual[key], expected[key])
    with pytest.raises(ValueError, match="not 'avg'"):
        make_server_optimizer("avg").load_state_dict(server.state_dict())


def test_adam_first_step_moves_each_weight_by_about_lr():
    weights, delta = delta_pair()
    new = make_server_optimizer("adam", lr=0.01, eps=1e-12).step(weights, delta)
    np.testing.assert_allclose(new["V"] - weights["V"], 0.01 * np.sign(delta["V"]))


def test_unknown_server_optimizer_or_option():
    with pytest.raises(ValueError,
                       match=r"'sgd'.*known: \['adam', 'avg', 'momentum', 'nesterov'\]"):
        make_server_optimizer("sgd")
    with pytest.raises(ValueError, match="unknown option"):
        make_server_optimizer("avg", beta=0.9)
    with pytest.raises(ValueError, match="beta"):
        make_server_optimizer("momentum", beta=1.0)


def test_weighted_average_weights_by_sample_count():
    weights, delta = delta_pair()
    average = weighted_average([weights, delta], [1, 3])
    np.testing.assert_allclose(average["V"], 0.25 * weights["V"] + 0.75 * delta["V"])


# --------------------------------------------------- delta averaging on the real data


@pytest.fixture(scope="module")
def compat_run():
    """The reference configuration for 25 rounds (about 3 s)."""
    spec = MLPSpec(compat=True)
    return run_delta_averaging(DATA_DIR, 25, spec, LocalTraining(epochs=15, eta=1e-4), seed=1)


def test_compat_reproduces_reference_errors(compat_run):
    errors = [round(error, 4) for _, error, _ in compat_run]
    assert errors[:5] == [0.9574, 0.9277, 0.7954, 0.7720, 0.8054]
    assert errors[20:] == [0.3297, 0.3211, 0.3440, 0.3354, 0.3240]
    assert [r for r, _, _ in compat_run] == list(range(1, 26))


def test_correct_relu_is_at_least_as_good_after_5_rounds(compat_run):
    results = run_delta_averaging(DATA_DIR, 5, MLPSpec(), LocalTraining(epochs=15, eta=1e-4))
    assert round(results[-1][1], 4) == 0.7691
    assert results[-1][1] <= compat_run[4][1]


def test_cli_prints_a_table(capsys):
    assert simulate.main(["--preset", "compat", "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].split()[:2] == ["2", "0.9277"]
    with pytest.raises(SystemExit) as info:
        simulate.main(["--help"])
    assert info.value.code == 0
