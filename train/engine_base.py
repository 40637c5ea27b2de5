"""What both training engines share (train.engine's tf.distribute step, train.jax_engine's
jitted step): the model, optimizer and loss terms they hold, the compiled metrics, and
the batch loop of `train_batch` / `evaluate` around each engine's own `_run`."""

import keras
import numpy as np

from train.loss_terms import weighted_terms


def host_numpy(batch):
    """A batch (tensors, arrays, None) as NumPy arrays on the host."""
    return keras.tree.map_structure(
        lambda a: None if a is None else np.asarray(a.numpy() if hasattr(a, "numpy") else a),
        batch,
    )


class EngineBase:
    """Subclasses define `build(batch)` and `_run(mode, batch)` -> (loss, count), with
    mode "train" or "eval" (loss None when the batch holds nothing to count)."""

    def __init__(self, model, loss_terms=None, terms_kind=None):
        self.model = model
        self.optimizer = model.optimizer
        self.terms = loss_terms or weighted_terms(getattr(model, "loss", None))
        self.terms_kind = terms_kind or getattr(self.terms, "kind", "weighted")
        self.pad_id = getattr(self.terms, "pad_id", 0)
        self._train_fn = None
        self._eval_fn = None

    def _metrics(self):
        compiled = getattr(self.model, "_compile_metrics", None)
        return [compiled] if compiled is not None else []

    def train_batch(self, batch):
        return self._run("train", batch)

    def reset_metrics(self):
        for m in self._metrics():
            m.reset_state()

    def metric_results(self):
        results = {}
        for m in self._metrics():
            value = m.result()
            if isinstance(value, dict):
                results.update({k: float(v) for k, v in value.items()})
            else:
                results[m.name] = float(value)
        return results

    def evaluate(self, data):
        self.reset_metrics()
        total, count = 0.0, 0.0
        for batch in data:
            loss, n = self._run("eval", batch)
            if loss is not None:
                total += loss * n
                count += n
        return {"loss": total / count if count else float("nan"), **self.metric_results()}
