"""SAGAN's losses, once, in `keras.ops`: the TensorFlow step (train/sagan/fit.py) and the
JAX step (train/sagan/jax_fit.py) both call these; only the gradient plumbing differs.

Every term is a SUM over this replica's rows divided by the GLOBAL batch size, so the
replicas' terms (and gradients) add up to the one-device value. Lim and Ye's hinge loss,
as in SAGAN:
    L_D = E[relu(1 - D(x, y))] + E[relu(1 + D(G(z, y'), y'))] + c * CE(s(x), y)
          [+ k * r/2 * E[|grad_x D(x, y)|^2] on every k-th D step]
    L_G = -E[D(G(z, y'), y')] + c * CE(s(G(z, y')), y') + m * MS
with s(.) D's projection class scores (dual projection; c = `class_loss`), MS the
mode-seeking term (weight m; G-step rows 2i and 2i+1 share a label) and the bracket the
R1 penalty on real images (Mescheder et al., 2018; weight r), applied lazily every
k = `R1_EVERY` D steps with k times its weight (Karras et al., 2020), so the double
backward pass costs a quarter of its price.
"""

from keras import ops

R1_EVERY = 4


def class_term(scores, labels, weight, global_batch):
    """`weight` times the cross-entropy of the class scores against `labels`."""
    ce = ops.sparse_categorical_crossentropy(ops.cast(labels, "int32"), scores, from_logits=True)
    return weight * ops.sum(ce) / global_batch


def mode_seeking(fake, noise, global_batch):
    """Mode seeking (Mao et al., 2019): rows 2i and 2i+1 share a label; each pair adds
    1 / (mean|G(z1)-G(z2)| / mean|z1-z2| + eps), so a generator that ignores its noise
    (one image per class) pays for it. Summed over pairs and divided by the global
    number of pairs, as the hinge loss is, so replicas add up."""
    n = (ops.shape(fake)[0] // 2) * 2
    fake = ops.cast(fake, "float32")
    images = ops.mean(ops.abs(fake[0:n:2] - fake[1:n:2]), axis=[1, 2, 3])
    latents = ops.mean(ops.abs(noise[0:n:2] - noise[1:n:2]), axis=1)
    return ops.sum(1.0 / (images / latents + 1e-5)) / (global_batch / 2.0)


def d_loss(loss_cfg, logits, scores, labels, global_batch, real_grads=None):
    """D's loss on `logits` of the real rows followed by as many fake rows: (total to
    differentiate, (hinge loss, mean real logit, mean fake logit)). D learns the
    classes of real images only; `real_grads`: the R1 step's input gradient."""
    batch = ops.shape(labels)[0]
    real_logits, fake_logits = logits[:batch], logits[batch:]
    loss = (
        ops.sum(ops.relu(1.0 - real_logits)) + ops.sum(ops.relu(1.0 + fake_logits))
    ) / global_batch
    total = loss
    if scores is not None:
        total = total + class_term(scores[:batch], labels, loss_cfg.class_loss, global_batch)
    if real_grads is not None:  # R1: R1_EVERY * r1 / 2 * sum |grad_x D(x)|^2 / global batch
        squares = ops.sum(ops.square(ops.cast(real_grads, "float32")))
        total = total + R1_EVERY * loss_cfg.r1 / 2.0 * squares / global_batch
    means = (ops.sum(real_logits) / global_batch, ops.sum(fake_logits) / global_batch)
    return total, (loss, *means)


def g_loss(loss_cfg, logits, scores, fake, noise, labels, global_batch):
    """G's loss: (total to differentiate, (hinge loss, mode-seeking term)). G makes
    images D classifies as the label asked for."""
    loss = -ops.sum(logits) / global_batch
    seeking = mode_seeking(fake, noise, global_batch) if loss_cfg.mode_seeking else ops.zeros(())
    total = loss + loss_cfg.mode_seeking * seeking
    if scores is not None:
        total = total + class_term(scores, labels, loss_cfg.class_loss, global_batch)
    return total, (loss, seeking)


def ema_update(ema_values, g_values, step, decay):
    """The EMA of G's float variables after G step `step`. Warm-up: early on the average
    follows G closely (decay ~ (1+t)/(10+t))."""
    step = ops.cast(step, "float32")
    rate = ops.minimum(decay, (1.0 + step) / (10.0 + step))
    return [
        rate * e + (1.0 - rate) * g if "float" in str(e.dtype) else e
        for e, g in zip(ema_values, g_values)
    ]
