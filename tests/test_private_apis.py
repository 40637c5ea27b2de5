"""The private TensorFlow APIs the project relies on still exist, so an upgrade that
moves one fails here by name instead of silently changing behaviour (each use falls
back quietly at run time).

- layers/attention_ops.py: `control_flow_util.GraphOrParentsInXlaContext` (is this
  graph compiled by XLA? picks the attention kernel);
- train/preemption.py: the eager context's coordination-service key-value store
  (`get/set/delete_config_key_value`), how workers agree on a stop step and a clock;
- train/strategy.py: `_pywrap_util_port.IsMklEnabled` (are oneDNN kernels on?).
"""

import pytest

tf = pytest.importorskip("tensorflow")


def test_xla_context_probe_exists():
    from tensorflow.python.ops import control_flow_util

    assert callable(control_flow_util.GraphOrParentsInXlaContext)
    assert control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()) is False


def test_coordination_key_value_store_exists():
    from tensorflow.python.eager import context

    ctx = context.context()
    for name in ("get_config_key_value", "set_config_key_value", "delete_config_key_value"):
        assert callable(getattr(ctx, name)), name


def test_onednn_probe_exists():
    from tensorflow.python.util import _pywrap_util_port

    assert _pywrap_util_port.IsMklEnabled() in (True, False)
    from train import strategy

    if strategy.backend() == "tensorflow":  # None would mean the probe fell back
        assert strategy.onednn() in (True, False)
