"""Delegate-compatibility check of a .tflite file: our own rules.

`tf.lite.experimental.Analyzer(gpu_compatibility=True)` checks nothing on
TF 2.21 (docs/facts.md), so the rules are written here, following the mobile GPU
delegate's own compatibility code (tensorflow/lite/tools/versioning/
gpu_compatibility.cc) and what docs/facts.md saw it reject:

gpu:  every op on the allowlist below with its per-op constraints; tensors of
      rank <= 4; no Flex or custom ops; and two patterns that LiteRT's GPU
      accelerator compiles, reports fully accelerated, and computes wrong: a
      BATCH_MATMUL whose first operand's batch is broadcast, and an
      elementwise op whose runtime operand has a lower rank than its output.
      The rules are calibrated against the real accelerator (LiteRT's
      CompiledModel with HardwareAccelerator.GPU: tests/export/test_check_calibration.py
      runs one small model per rule on it and the verdicts must agree; what it
      showed is in docs/facts.md, LiteRT). The ops that need a dynamic shape
      (SHAPE, FILL, RANGE, ...) are what rejects a dynamic export.
int8: every op computes in integers: no float tensor enters or leaves any op
      except the QUANTIZE of a float model input and the DEQUANTIZE of a
      model output (anything else is a float island that an integer-only
      accelerator cannot run); static shapes; no Flex or custom ops.

The flatbuffer is read with ai_edge_litert's schema_py_generated.
"""

import collections
import dataclasses
import math
import os

from export import gpu_rewrite
from export.flatbuffer import Graph, op_name, read_model
from zoo.cli import UsageError

TARGETS = ("gpu", "int8")

_UNARY = {
    "ABS",
    "CEIL",
    "COS",
    "ELU",
    "EXP",
    "FLOOR",
    "GELU",
    "LOG",
    "LOGISTIC",
    "NEG",
    "RSQRT",
    "SIGN",
    "SIN",
    "SQRT",
    "SQUARE",
    "TANH",
    "HARD_SWISH",
    "RELU",
    "RELU6",
    "RELU_N1_TO_1",
    "LEAKY_RELU",
    "PRELU",
}
_OTHER = {
    "ADD_N",
    "ARG_MAX",
    "AVERAGE_POOL_2D",
    "BATCH_MATMUL",
    "CAST",
    "CONCATENATION",
    "CONV_2D",
    "CUMSUM",
    "DENSIFY",
    "DEPTHWISE_CONV_2D",
    "DEPTH_TO_SPACE",
    "DEQUANTIZE",
    "EMBEDDING_LOOKUP",
    "DYNAMIC_UPDATE_SLICE",
    "FULLY_CONNECTED",
    "GATHER",
    "LSTM",
    "MAX_POOL_2D",
    "MEAN",
    "PACK",
    "ONE_HOT",
    "QUANTIZE",
    "RESHAPE",
    "SELECT",
    "SELECT_V2",
    "SLICE",
    "SOFTMAX",
    "SPACE_TO_DEPTH",
    "SPLIT",
    "SPLIT_V",
    "STRIDED_SLICE",
    "TILE",
    "TRANSPOSE",
    "TRANSPOSE_CONV",
    "RESIZE_BILINEAR",
    "RESIZE_NEAREST_NEIGHBOR",
    "REDUCE_MAX",
    "REDUCE_MIN",
    "REDUCE_PROD",
    "SUM",
    "PAD",
    "PADV2",
    "MIRROR_PAD",
    "STABLEHLO_CLAMP",
}
# Every broadcasting elementwise op but LOGICAL_OR.
GPU_OPS = frozenset(_UNARY | (gpu_rewrite.BROADCASTING - {"LOGICAL_OR"}) | _OTHER)

# Seen rejected by the delegate (docs/facts.md); named so the message can say why.
_KNOWN_REJECTED = {
    "SHAPE": "dynamic-shape op",
    "BROADCAST_TO": "use implicit broadcasting",
    "FILL": "build constants at export time",
    "RANGE": "build positions as constants",
    "EXPAND_DIMS": "use RESHAPE",
    "GATHER_ND": "use a 1-D GATHER",
    "WHILE": "run the loop in the app",
}
# ARG_MAX left this list: LiteRT's GPU accelerator runs it (calibration case arg_max).

_FLOAT = {"FLOAT32", "FLOAT16", "FLOAT64", "BFLOAT16"}


@dataclasses.dataclass
class Problem:
    subgraph: int
    index: int
    op: str
    reason: str
    tensors: str

    def __str__(self):
        where = f"subgraph {self.subgraph} " if self.subgraph else ""
        return f"{where}op #{self.index} {self.op}: {self.reason}\n    {self.tensors}"


def _gpu_op_rules(g, op, name):
    """Per-op constraints of the GPU delegate (gpu_compatibility.cc)."""
    ins = [i for i in op.inputs if i >= 0]
    opts = op.builtinOptions
    if name in _KNOWN_REJECTED:
        return [f"not supported by the GPU delegate ({_KNOWN_REJECTED[name]})"]
    if name.startswith(("Flex", "CUSTOM:")):
        return ["Flex/custom op: not a TFLite builtin"]
    if name not in GPU_OPS:
        return ["not supported by the GPU delegate"]
    out = []
    if name == "SOFTMAX" and opts is not None and opts.beta != 1:
        out.append(f"SOFTMAX beta {opts.beta} != 1")
    if name in gpu_rewrite.FP16_CONST_REJECTED_BY and ins and ins[0] in g.dequantized:
        out.append(
            f"{name} of a DEQUANTIZEd {g.dtype(g.dequantized[ins[0]]).lower()} constant: the GPU accelerator "
            "rejects it (make it a float32 constant; export/gpu_rewrite.py)"
        )
    elif name == "RESHAPE" and ins and g.is_const(ins[0]):
        out.append("RESHAPE of a constant: the GPU accelerator needs a runtime input")
    if name == "GATHER":
        if len(g.dims(ins[1])) != 1:
            out.append(f"GATHER indices must be 1-D, got rank {len(g.dims(ins[1]))}")
        if g.dtype(ins[1]) != "INT32":
            out.append(f"GATHER indices must be int32, got {g.dtype(ins[1]).lower()}")
    if name == "EMBEDDING_LOOKUP" and len(g.dims(ins[0])) != 1:
        out.append("EMBEDDING_LOOKUP ids must be 1-D")
    if name == "STRIDED_SLICE" and opts is not None:
        for mask in ("ellipsisMask", "newAxisMask", "shrinkAxisMask"):
            if getattr(opts, mask, 0):
                out.append(f"STRIDED_SLICE with {mask}={getattr(opts, mask)}")
    if name in ("ADD", "MUL") and len(ins) == 2:
        a, b = g.dims(ins[0]), g.dims(ins[1])
        broadcastable = all(x == y or 1 in (x, y) for x, y in zip(a[::-1], b[::-1]))
        if len(a) > 1 and len(b) > 1 and len(a) != len(b) and not broadcastable:
            out.append(f"{name} cannot broadcast {a} with {b}")
    for slot in gpu_rewrite.low_rank_operands(g, op, name):
        i = op.inputs[slot]
        out.append(
            f"{name}'s runtime operand {g.dims(i)} has a lower rank than its output "
            f"{g.dims(op.outputs[0])}: the GPU accelerator computes this wrong "
            "(RESHAPE it to the output's rank; export/gpu_rewrite.py)"
        )
    if name == "BATCH_MATMUL" and len(ins) == 2:
        a, b, o = g.dims(ins[0]), g.dims(ins[1]), g.dims(op.outputs[0])
        if math.prod(a[:-2]) < math.prod(o[:-2]):
            out.append(
                f"BATCH_MATMUL broadcasts its first operand's batch ({a} x {b} -> {o}): the GPU "
                "accelerator computes this wrong (mat_mul_as_convolution shape mismatch)"
            )
    if name == "ADD_N" and len(ins) != 2:
        out.append("ADD_N supports exactly 2 inputs")
    if name in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD") and len(ins) > 1:
        if not g.is_const(ins[1]) or g.dtype(ins[1]) != "INT32":
            out.append(f"{name} needs constant int32 axes")
    if name in ("PAD", "PADV2", "MIRROR_PAD") and len(ins) > 1:
        p = g.dims(ins[1])
        if len(p) != 2 or p[0] not in (3, 4) or p[1] != 2:
            out.append(f"{name} paddings must be 3x2 or 4x2, got {p}")
        if name == "MIRROR_PAD" and opts is not None and opts.mode != 0:
            out.append("MIRROR_PAD only in REFLECT mode")
    if name == "FULLY_CONNECTED":
        if opts is not None and opts.weightsFormat != 0:
            out.append("FULLY_CONNECTED with shuffled weights format")
        if g.is_const(ins[0]):
            out.append("FULLY_CONNECTED with a constant input")
        if sum(not g.is_const(i) for i in ins) > 2:
            out.append("FULLY_CONNECTED with more than 2 runtime inputs")
        if (
            opts is not None
            and opts.keepNumDims
            and len(g.dims(ins[0])) != len(g.dims(op.outputs[0]))
        ):
            out.append("FULLY_CONNECTED keep_num_dims with differing ranks")
    if name == "CAST":
        src, dst = g.dtype(ins[0]), g.dtype(op.outputs[0])
        ok = (
            (src == "BOOL" and dst in ("FLOAT16", "FLOAT32"))
            or (src in ("FLOAT16", "FLOAT32") and dst == "BOOL")
            or (src in ("FLOAT32", "INT32") and dst in ("FLOAT32", "INT32"))
        )
        if not ok:
            out.append(f"CAST {src.lower()} -> {dst.lower()}")
    if name == "DEQUANTIZE" and g.dtype(ins[0]) == "INT16":
        out.append("DEQUANTIZE of int16")
    if name in ("SELECT", "SELECT_V2"):
        if g.dtype(ins[0]) not in ("BOOL", "FLOAT16", "FLOAT32") or any(
            g.dtype(i) not in ("FLOAT16", "FLOAT32") for i in ins[1:]
        ):
            out.append(
                f"{name} needs a bool/float condition and float values, got "
                + ", ".join(g.dtype(i).lower() for i in ins)
            )
        outd = g.dims(op.outputs[0])
        for i in ins[1:]:
            d = g.dims(i)
            if d and d != outd and (len(d) > 1 or d[0] > 1):
                out.append(f"{name} value {d} neither scalar nor output shape {outd}")
    if name == "DYNAMIC_UPDATE_SLICE":
        operand, start = g.dims(ins[0]), g.dims(ins[2])
        if len(operand) == 4 and operand[0] != 1:
            out.append("DYNAMIC_UPDATE_SLICE of a 4-D operand needs batch 1")
        if len(start) != 1 or g.dtype(ins[2]) != "INT32":
            out.append("DYNAMIC_UPDATE_SLICE needs 1-D int32 start indices")
    return out


def _int8_op_rules(g, op, name, graph_inputs, graph_outputs):
    if name.startswith(("Flex", "CUSTOM:")):
        return ["Flex/custom op: not a TFLite builtin"]
    ins = [i for i in op.inputs if i >= 0]
    outs = [i for i in op.outputs if i >= 0]
    if name == "QUANTIZE" and all(i in graph_inputs for i in ins if g.dtype(i) in _FLOAT):
        return []  # float model input converted once at the boundary
    if name == "DEQUANTIZE" and all(i in graph_outputs for i in outs):
        return []  # float model output converted once at the boundary
    floats = [i for i in ins + outs if g.dtype(i) in _FLOAT]
    if not floats:
        return []
    if name == "DEQUANTIZE":
        return ["DEQUANTIZE into float inside the graph (start of a float island)"]
    if name == "QUANTIZE":
        return ["QUANTIZE from float inside the graph (end of a float island)"]
    return ["computes in float (" + ", ".join(sorted({g.dtype(i).lower() for i in floats})) + ")"]


def check_model(content, target="gpu"):
    """Returns the list of `Problem`s of `content` (.tflite bytes) for `target`."""
    if target not in TARGETS:
        raise UsageError(f"unknown --target {target!r} (choose from {', '.join(TARGETS)})")
    model = read_model(content)
    problems = []
    for s, sg in enumerate(model.subgraphs or []):
        g = Graph(model, sg)
        graph_inputs = set(sg.inputs if sg.inputs is not None else [])
        graph_outputs = set(sg.outputs if sg.outputs is not None else [])
        for k, op in enumerate(sg.operators if sg.operators is not None else []):
            name = op_name(model, op)
            if target == "gpu":
                reasons = _gpu_op_rules(g, op, name)
            else:
                reasons = _int8_op_rules(g, op, name, graph_inputs, graph_outputs)
            dynamic = []
            for i in [i for i in list(op.inputs) + list(op.outputs) if i >= 0]:
                d = g.dims(i)
                if target == "gpu" and len(d) > 4:
                    reasons.append(f"{len(d)}-D tensor {d} (the GPU delegate handles rank <= 4)")
                # -1 dimensions alone: the GPU accelerator resizes (calibration
                # cases dynamic_batch / dynamic_length); integer accelerators need static shapes.
                if target == "int8" and -1 in d and not g.is_const(i) and d not in dynamic:
                    dynamic.append(d)
            if dynamic:
                reasons.append("dynamic (-1) dimensions in " + ", ".join(map(str, dynamic)))
            for r in dict.fromkeys(reasons):
                problems.append(Problem(s, k, name, r, g.describe(op)))
    if not any(sg.operators is not None and len(sg.operators) for sg in model.subgraphs or []):
        # Fail closed: a model with nothing in it has passed no rule.
        problems.append(Problem(0, 0, "-", "the model has no operators: nothing was checked", ""))
    return problems


def check_file(path, target="gpu"):
    if not os.path.isfile(path):
        raise UsageError(f"no such .tflite file: {path}")
    with open(path, "rb") as f:
        content = f.read()
    return check_model(content, target)


def op_counts(content):
    """{op name: count} over all subgraphs (for reports and tests)."""
    model = read_model(content)
    ops = [op_name(model, op) for sg in model.subgraphs or [] for op in sg.operators or []]
    return dict(collections.Counter(ops))
