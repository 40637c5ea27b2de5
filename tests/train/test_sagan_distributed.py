"""`python -m train sagan` under tf.distribute: two mirrored replicas == one device.

The mirrored run is a separate process (this file, run as a script): logical CPU
devices must be configured before TensorFlow initialises. It trains one epoch on two
logical CPUs, then resumes a copy of its checkpoint on ONE device for a second epoch.
Meanwhile this process trains the same run on one device for two epochs, keeping the
state after each epoch. Checked: after epoch 1, G, D, EMA-G and both optimizers agree
to 1e-5; the mirrored checkpoint resumed on one device ends where the one-device run
ends; the two replicas' copies of every variable stayed identical; and
ConditionalBatchNormalization(synchronized=True) on 2 replicas equals the NumPy batch
norm of the whole global batch (output, input gradient, moving statistics).

python -m tests.train.test_sagan_distributed --logical-cpus 2 --cbn-check FILE
    --resume-copy DIR2 -- sagan --strategy mirrored --out DIR ...
"""

import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tests.support import paths
from tests.support.runs import training_env

ROOT = pathlib.Path(paths.ROOT)
TIMEOUT = 300
# 32x32 shapes, width 8, latent 16; 4 D steps (global batch 8) and 2 G steps per epoch.
TINY = [
    "--train-size",
    "32",
    "--test-size",
    "16",
    "--batch-size",
    "8",
    "--n-dis",
    "2",
    "--width",
    "8",
    "--latent-dim",
    "16",
    "--eval-samples",
    "16",
    "--epoch-eval-samples",
    "0",
    "--classifier-epochs",
    "1",
    "--seed",
    "3",
    # Constant rates: the mirrored run stops after epoch 1 and is compared with epoch 1 of
    # a 2-epoch run, whose rates would decay later (the schedule spans each run's epochs).
    "--lr-decay-from",
    "1",
]
GROUPS = ("g", "d", "ema", "g_opt", "d_opt")


# ---------------------------------------------------------------- the mirrored process
def _cbn_check(strategy, path):
    """Runs ConditionalBatchNormalization on the replicas' slices of one global batch."""
    import numpy as np
    import tensorflow as tf

    from layers import ConditionalBatchNormalization
    from train.model_step import split

    rng = np.random.default_rng(5)
    x = (rng.normal(size=(8, 3, 3, 4)) * 2 + 1).astype("float32")
    labels = rng.integers(0, 3, size=8).astype("int32")
    weights = rng.normal(size=x.shape).astype("float32")
    out = {"x": x, "labels": labels, "weights": weights}
    for synchronized in (True, False):
        with strategy.scope():
            layer = ConditionalBatchNormalization(
                3,
                momentum=0.9,
                synchronized=synchronized,
                gamma_initializer="random_normal",
                beta_initializer="random_normal",
            )
            layer.build(x.shape, labels.shape)

        def replica(x_, labels_, weights_, layer=layer):
            with tf.GradientTape() as tape:
                tape.watch(x_)
                y = layer(x_, labels_, training=True)
                loss = tf.reduce_sum(y * weights_)
            return y, tape.gradient(loss, x_)

        step = tf.function(lambda *parts, replica=replica: strategy.run(replica, args=parts))
        y, grad = step(*split(strategy, (x, labels, weights)))
        tag = "sync" if synchronized else "local"
        out[f"{tag}_y"] = np.concatenate(
            [t.numpy() for t in strategy.experimental_local_results(y)]
        )
        out[f"{tag}_grad"] = np.concatenate(
            [t.numpy() for t in strategy.experimental_local_results(grad)]
        )
        out[f"{tag}_gamma"], out[f"{tag}_beta"] = layer.gamma.numpy(), layer.beta.numpy()
        out[f"{tag}_moving_mean"] = layer.moving_mean.numpy()
        out[f"{tag}_moving_variance"] = layer.moving_variance.numpy()
    np.savez(path, **out)


def _replica_spread(trainer):
    """Largest difference between a variable's copy on any replica and on replica 0."""
    import numpy as np

    spread = 0.0
    for model in (trainer.g, trainer.d, trainer.ema):
        for v in model.variables:
            copies = [np.asarray(t) for t in trainer.strategy.experimental_local_results(v.value)]
            spread = max([spread] + [float(np.max(np.abs(c - copies[0]))) for c in copies[1:]])
    return spread


def _adam_epsilon_one():
    """Makes the SAGAN trainer's Adam use epsilon 1 (returns the original factory).

    With Adam's own epsilon (1e-7) every gradient element is divided by its own size,
    so an element whose gradient is ~1e-7 (float noise) moves by up to lr on a rounding
    difference; two summation orders (2 replicas vs 1 device) then drift ~1e-4 apart
    in a few steps, whichever change of rounding triggers it (seeds 3, 4 and 5 each
    failed on some version of the code). With epsilon 1 the comparison is about the
    distributed step, not about Adam's amplification of rounding."""
    import train.sagan.fit as sagan_fit

    make = sagan_fit._adam

    def adam(lr, beta_1, beta_2):
        optimizer = make(lr, beta_1, beta_2)
        sagan_fit._inner(optimizer).epsilon = 1.0
        return optimizer

    sagan_fit._adam = adam
    return make


def worker_main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--logical-cpus", type=int, default=1)
    p.add_argument("--cbn-check")
    p.add_argument("--resume-copy")
    p.add_argument("cli", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus
    )
    import train.sagan.training as sagan_run
    from train.cli import main

    cli = args.cli[1:] if args.cli[:1] == ["--"] else args.cli
    _adam_epsilon_one()
    trainers = []
    make_step = sagan_run._step
    sagan_run._step = lambda *a, **k: trainers.append(make_step(*a, **k)) or trainers[-1]
    assert main(cli) == 0
    out = pathlib.Path(cli[cli.index("--out") + 1])
    print("replicas", trainers[-1].replicas, "spread", _replica_spread(trainers[-1]), flush=True)
    if args.cbn_check:
        # The run's own strategy: a second MirroredStrategy on the same devices would reuse
        # its collective instance keys with other shapes.
        _cbn_check(trainers[-1].strategy, args.cbn_check)
    if args.resume_copy:
        shutil.copytree(out, args.resume_copy)
        assert (
            main(
                [
                    "sagan",
                    "--out",
                    args.resume_copy,
                    "--resume",
                    "--epochs",
                    "2",
                    "--strategy",
                    "default",
                ]
            )
            == 0
        )
        print("resumed replicas", trainers[-1].replicas, flush=True)


# ---------------------------------------------------------------- the tests
def _state(path):
    import numpy as np

    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _newest(run_dir):
    from train import checkpoint

    return checkpoint.latest(run_dir / "checkpoints")[0]


def _snapshot(step):
    """A SAGAN step's checkpoint variables as the checkpoint keys them (group/path, an
    optimizer slot by its variable's path: the optimizer's own name is numbered per
    process)."""
    import numpy as np

    from train import checkpoint

    refs = step.refs()
    return {
        f"{group}/{key}": np.array(v.numpy())
        for group, variables in step.variables().items()
        for key, v in zip(checkpoint._keys(variables, refs.get(group))[0], variables)
    }


# Biases that feed straight into a batch norm (every conv of an up-block: each is
# followed by a norm) have a true gradient of zero; their float-noise
# gradients, normalised by Adam, move them by up to ~lr per step in a direction no
# summation order reproduces, and the following norms' moving means track them. These
# are compared to a bound on that drift; everything else to 1e-5.
# A ReLU input within ~1e-5 of zero can take the other sign on another summation order,
# and G's gradient then differs (up to a few percent seen without attention; see
# docs/distributed.md): the weights absorb it within 1e-5 over these few steps, the
# optimizers' slots are compared to 1% of their scale (_assert_equals_single).
NULL_SPACE = re.compile(r"(conv1|conv2|shortcut)/bias$|moving_mean$")
NULL_SPACE_BOUND = 1e-3


def _generator_paths(run_dir):
    import zoo

    config = json.loads((run_dir / "config.json").read_text())
    return [v.path for v in zoo.build("sagan_generator", **config["model"]).variables]


def _max_diffs(a, b, paths, groups=GROUPS):
    """(largest difference over the exactly comparable values, over the null space)."""
    import numpy as np

    exact, null = 0.0, 0.0
    for group in groups:
        keys = sorted(k for k in a if k.startswith(group + "/"))
        assert keys and keys == sorted(k for k in b if k.startswith(group + "/")), group
        for key in keys:
            diff = float(np.max(np.abs(a[key].astype("float64") - b[key])))
            name = key.split("/", 1)[1]  # the variable's path (by index in old checkpoints)
            path = paths[int(name)] if name.isdigit() else name
            if group in ("g", "ema") and NULL_SPACE.search(path):
                null = max(null, diff)
            else:
                exact = max(exact, diff)
    return exact, null


def _moved(a, b):
    import numpy as np

    return max(
        float(np.max(np.abs(a[k].astype("float64") - b[k]))) for k in a if k.startswith("g/")
    )


def _bn_reference(x, labels, gamma, beta, weights, eps=1e-5):
    """Batch norm over axes (0, 1, 2) and its input gradient for loss = sum(y * weights)."""
    import numpy as np

    x = x.astype("float64")
    n = x.shape[0] * x.shape[1] * x.shape[2]
    mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    inv = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean) * inv
    g, b = gamma[labels][:, None, None], beta[labels][:, None, None]
    dxhat = weights * g
    grad = (
        inv
        / n
        * (n * dxhat - dxhat.sum(axis=(0, 1, 2)) - xhat * (dxhat * xhat).sum(axis=(0, 1, 2)))
    )
    return xhat * g + b, grad, mean, var


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The mirrored process (epoch 1 on 2 replicas, then epoch 2 on 1 device) and, at the
    same time in this process, the one-device run of 2 epochs (state kept per epoch)."""
    import train.sagan.fit as sagan_fit
    from train import checkpoint
    from train.cli import main

    base = tmp_path_factory.mktemp("sagan_dist")
    env = training_env()
    cmd = [
        sys.executable,
        "-m",
        "tests.train.test_sagan_distributed",
        "--logical-cpus",
        "2",
        "--cbn-check",
        str(base / "cbn.npz"),
        "--resume-copy",
        str(base / "mirrored_resumed"),
        "--",
        "sagan",
        "--strategy",
        "mirrored",
        "--jit-compile",
        "--out",
        str(base / "mirrored"),
        "--epochs",
        "1",
        *TINY,
    ]
    log = open(base / "mirrored.log", "w")  # a file, not a pipe: the child never blocks on output
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        save = checkpoint.save

        def keep_each_epoch(directory, groups, record, **kwargs):
            path = save(directory, groups, record, **kwargs)
            if kwargs.get("name", "step") == "step" and not record["batches_done"]:
                shutil.copy(path, base / f"single-e{record['epoch']}.npz")
            return path

        checkpoint.save = keep_each_epoch
        make_adam = _adam_epsilon_one()
        try:
            assert (
                main(
                    [
                        "sagan",
                        "--strategy",
                        "default",
                        "--out",
                        str(base / "single"),
                        "--epochs",
                        "2",
                        *TINY,
                    ]
                )
                == 0
            )
        finally:
            checkpoint.save = save
            sagan_fit._adam = make_adam
        proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    output = (base / "mirrored.log").read_text()
    assert proc.returncode == 0, output[-3000:]
    return base, output


def _assert_equals_single(base, state_path, single_name):
    """The state at `state_path` equals the one-device run's `single_name`: weights to
    1e-5 (the batch-norm null-space variables within NULL_SPACE_BOUND), each optimizer's
    slots to 1% of its largest slot value. With beta_1 = 0, Adam's first slot is the
    last gradient itself, where a ReLU tie shows undamped (seen: 0.1%, on one of three
    seeds, after the upsampling gradient changed its summation order); a step that
    dropped or doubled a replica's share would be off by 50-100%. Returns the state."""
    import numpy as np

    single = _state(base / single_name)
    state = _state(state_path)
    exact, null = _max_diffs(state, single, _generator_paths(base / "single"), ("g", "d", "ema"))
    assert exact < 1e-5 and null < NULL_SPACE_BOUND, (exact, null)
    for group in ("g_opt", "d_opt"):
        slots = [k for k in single if k.startswith(group + "/")]
        assert slots and all(k in state for k in slots), group
        scale = max(float(np.max(np.abs(single[k]))) for k in slots)
        worst = max(float(np.max(np.abs(state[k].astype("float64") - single[k]))) for k in slots)
        assert worst < 1e-2 * scale, (group, worst, scale)
    return single


@pytest.mark.slow
def test_mirrored_two_replicas_equal_one_device(runs):
    base, output = runs
    assert "replicas 2" in output
    single = _assert_equals_single(base, _newest(base / "mirrored"), "single-e1.npz")
    # ... and training moved the weights (not a comparison of initial values)
    assert _moved(single, _state(base / "single-e2.npz")) > 1e-3
    metrics = json.loads((base / "mirrored" / "metrics.json").read_text())
    assert metrics["runtime"]["devices"] == 2 and metrics["runtime"]["strategy"] == "mirrored"
    # --jit-compile on 2 replicas: the steps ran without XLA (sagan_fit.py says why), and
    # the run says so instead of failing on XLA's one-device limit.
    assert "XLA: off for sagan on 2 replicas" in output
    # ... and the start line, config.json and metrics.json record what ran.
    assert "(mirrored), float32, XLA off" in output and "XLA on" not in output
    config = json.loads((base / "mirrored" / "config.json").read_text())
    assert config["runtime"]["jit_compile"] is False
    assert metrics["runtime"]["jit_compile"] is False


@pytest.mark.slow
def test_replicas_hold_identical_copies(runs):
    _, output = runs
    spread = float(output.split(" spread ")[1].split()[0])
    assert spread <= 1e-6, spread


@pytest.mark.slow
def test_mirrored_checkpoint_resumes_on_one_device(runs):
    base, output = runs
    assert "resumed replicas 1" in output
    from train import checkpoint

    _assert_equals_single(base, _newest(base / "mirrored_resumed"), "single-e2.npz")
    state = checkpoint.latest(base / "mirrored_resumed" / "checkpoints")[1]["state"]
    assert state["epoch"] == 2 and state["step"] == 8


@pytest.mark.slow
def test_synchronized_conditional_batch_norm_is_the_global_batch_norm(runs):
    import numpy as np

    base, _ = runs
    with np.load(base / "cbn.npz") as f:
        c = {k: f[k] for k in f.files}
    x, labels, weights = c["x"], c["labels"], c["weights"]
    want_y, want_grad, mean, var = _bn_reference(
        x, labels, c["sync_gamma"], c["sync_beta"], weights
    )
    np.testing.assert_allclose(c["sync_y"], want_y, atol=1e-4)
    np.testing.assert_allclose(c["sync_grad"], want_grad, atol=1e-4)
    np.testing.assert_allclose(c["sync_moving_mean"], 0.1 * mean, atol=1e-5)
    np.testing.assert_allclose(c["sync_moving_variance"], 0.9 + 0.1 * var, atol=1e-5)
    # Without synchronisation each replica normalises its own half; the moving statistics
    # are the MEAN over replicas.
    halves = [
        _bn_reference(
            x[i : i + 4], labels[i : i + 4], c["local_gamma"], c["local_beta"], weights[i : i + 4]
        )
        for i in (0, 4)
    ]
    np.testing.assert_allclose(c["local_y"], np.concatenate([h[0] for h in halves]), atol=1e-4)
    np.testing.assert_allclose(
        c["local_moving_mean"], 0.1 * (halves[0][2] + halves[1][2]) / 2, atol=1e-5
    )
    assert np.max(np.abs(c["local_y"] - c["sync_y"])) > 1e-2


def _tiny_trainer(attention=None, with_ema=False, jit_compile=False, **recipe):
    import zoo
    from tests.support import sagan_steps
    from train.sagan.fit import TfSaganStep

    kwargs = {
        "image_size": 32,
        "num_classes": 4,
        "width": 4,
        "attention_resolution": attention,
        "seed": 1,
    }
    g = zoo.build("sagan_generator", latent_dim=8, **kwargs)
    d = zoo.build("sagan_discriminator", **kwargs)
    ema = None
    if with_ema:
        ema = zoo.build("sagan_generator", latent_dim=8, **kwargs)
        ema.set_weights(g.get_weights())
    settings = {"num_classes": 4, "latent_dim": 8, "mode_seeking": 0.0, "class_loss": 0.0}
    return TfSaganStep(
        (g, d, ema),
        sagan_steps.recipe(**{**settings, "r1": 0.0, **recipe}),
        jit_compile=jit_compile,
    )


def _train(step, real, labels, d_step):
    from train.engine import At

    logs = step.train((real, labels), At(d_step, 0.0))
    return {k: v for k, (v, _) in logs.items()}


@pytest.mark.slow
def test_float16_scales_the_loss_and_its_checkpoint_restores_in_float32(tmp_path):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    real = rng.uniform(-1, 1, size=(4, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 4, size=4).astype("int32")
    keras.config.set_dtype_policy("mixed_float16")
    trainer = _tiny_trainer()
    assert isinstance(trainer.d_opt, keras.optimizers.LossScaleOptimizer)
    assert isinstance(trainer.g_opt, keras.optimizers.LossScaleOptimizer)
    before = [np.array(v.numpy()) for v in trainer.d.trainable_variables]
    for step in range(3):
        logs = _train(trainer, real, labels, step)
        assert all(np.isfinite(v) for v in logs.values()), logs
    # Steps whose scaled float16 gradients overflow are skipped (the scale halves); the
    # others update D.
    assert int(trainer.d_opt.iterations.numpy()) >= 1
    assert float(trainer.d_opt.dynamic_scale.numpy()) <= trainer.d_opt.initial_scale
    assert any(
        np.max(np.abs(a - v.numpy())) > 0 for a, v in zip(before, trainer.d.trainable_variables)
    )
    from train import checkpoint

    path = checkpoint.save(str(tmp_path), trainer.variables(), {"step": 3}, refs=trainer.refs())
    keras.config.set_dtype_policy("float32")
    restored = _tiny_trainer()
    assert not isinstance(restored.d_opt, keras.optimizers.LossScaleOptimizer)
    checkpoint.restore(path, restored.variables(), refs=restored.refs(), optional=restored.optional)
    for a, b in zip(
        trainer.g.variables + trainer.d_opt.inner_optimizer.variables,
        restored.g.variables + restored.d_opt.variables,
    ):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))


@pytest.mark.slow
def test_jit_compiled_steps_equal_the_uncompiled_steps(tmp_path):
    """Six steps (3 D + G pairs, attention at 16x16, EMA) with both steps under XLA end
    where the same steps without XLA end. Adam's epsilon is raised to 1 here: with
    1e-7, Adam divides each gradient by its own size, so an element whose gradient is
    ~1e-7 moves by up to lr on a rounding difference (seen: 2.3e-5 after one D step);
    the comparison is then about Adam, not about the step."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    real = rng.uniform(-1, 1, size=(8, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 4, size=8).astype("int32")
    states = {}
    for jit in (False, True):
        keras.utils.set_random_seed(0)
        trainer = _tiny_trainer(
            attention=16, with_ema=True, n_dis=2, lr_d=0.01, lr_g=0.01, jit_compile=jit
        )
        assert trainer.jit_compile is jit
        trainer.d_opt.epsilon = trainer.g_opt.epsilon = 1.0
        initial = _snapshot(trainer)
        for step in range(6):
            logs = _train(trainer, real, labels, step)
            assert all(np.isfinite(v) for v in logs.values()), logs
        states[jit] = _snapshot(trainer)
    exact, null = _max_diffs(states[True], states[False], [v.path for v in trainer.g.variables])
    assert exact < 1e-5 and null < 1e-5, (exact, null)
    # XLA's fused kernels round differently from TensorFlow's: a difference of exactly 0
    # would mean the compiled step never ran.
    assert exact > 0
    assert _moved(initial, states[False]) > 1e-3


@pytest.mark.slow
def test_jit_compile_flag_reaches_the_sagan_trainer():
    import train.sagan.training as sagan_run
    from tests.support import sagan_steps
    from train import strategy as dist

    trainer = _tiny_trainer()
    model_cfg = {"num_classes": 4, "latent_dim": 8}
    train_cfg = {k: v for k, v in vars(sagan_steps.recipe()).items() if k not in model_cfg}
    for flag in (True, False, None):
        context = dist.configure(
            argparse.Namespace(strategy="default", mixed_precision=False, jit_compile=flag)
        )
        want = context.device_kind() in ("gpu", "tpu") if flag is None else flag
        made = sagan_run._step(context, (trainer.g, trainer.d, None), model_cfg, train_cfg)
        assert made.jit_compile is want, flag


@pytest.mark.slow
def test_configure_accepts_every_strategy_for_sagan():
    from train import strategy as dist

    for name in ("mirrored", "default", "auto"):
        assert dist.configure(argparse.Namespace(strategy=name, mixed_precision=False)).name == name


if __name__ == "__main__":
    worker_main(sys.argv[1:])
