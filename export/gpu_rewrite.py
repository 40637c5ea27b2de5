"""Rewrites of a .tflite flatbuffer that LiteRT's GPU accelerator needs.

An elementwise op (ADD, MUL, SUB, ...) whose runtime operand has a lower rank
than its output (e.g. ADD `[64, 16]` + const `[1, 64, 16]` -> `[1, 64, 16]`) is
computed wrong by the GPU accelerator, with no error and the model reported
fully accelerated (measured on lavapipe: the seq2seq encoder's token embedding
plus positions off by 0.39). `legalize` puts a RESHAPE to the output's rank
(leading 1s: the same numbers) in front of every such operand; the arithmetic is
unchanged, so CPU results are bitwise the same. `export/check.py` flags the
pattern in files written without it.
"""

import numpy as np

from export.flatbuffer import Graph, op_name, read_model, schema, write_model

# Elementwise ops with NumPy-style broadcasting of two operands.
BROADCASTING = frozenset(
    {
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "MAXIMUM",
        "MINIMUM",
        "POW",
        "SQUARED_DIFFERENCE",
        "FLOOR_DIV",
        "FLOOR_MOD",
        "LESS",
        "LESS_EQUAL",
        "GREATER",
        "GREATER_EQUAL",
        "EQUAL",
        "NOT_EQUAL",
        "LOGICAL_AND",
        "LOGICAL_OR",
        "ATAN2",
    }
)


def low_rank_operands(g, op, name):
    """Input slots of `op` whose runtime tensor has rank in [1, output rank)."""
    if name not in BROADCASTING:
        return []
    out_rank = len(g.dims(op.outputs[0]))
    return [
        slot
        for slot, i in enumerate(op.inputs)
        if i >= 0 and not g.is_const(i) and 1 <= len(g.dims(i)) < out_rank
    ]


# Consumers that reject a float16 constant seen through DEQUANTIZE (measured on
# the tagger's fp16 --static-shape export: "GATHER: Input / output dtype
# mismatch", "RESHAPE: Expected 1 runtime input tensor(s), but node has 0").
# FULLY_CONNECTED / CONV_2D weights and elementwise operands take it.
FP16_CONST_REJECTED_BY = frozenset({"GATHER", "RESHAPE"})


def _fold_fp16_constants(model, sg):
    """Makes float32 constants of the DEQUANTIZEd float16 constants that a
    GATHER or RESHAPE reads (their bytes double; the rest stay float16)."""
    g = Graph(model, sg)
    fold = {
        i
        for op in (sg.operators if sg.operators is not None else [])
        if op_name(model, op) in FP16_CONST_REJECTED_BY
        for i in op.inputs
        if i in g.dequantized and g.dtype(g.dequantized[i]) == "FLOAT16"
    }
    if not fold:
        return False
    for t in fold:
        src = sg.tensors[g.dequantized[t]]
        half = np.frombuffer(bytes(bytearray(model.buffers[src.buffer].data)), np.float16)
        sg.tensors[t].buffer = _buffer(model, half.astype(np.float32))
    # the DEQUANTIZEs that made them go
    sg.operators = [op for op in sg.operators if fold.isdisjoint(op.outputs)]
    return True


def legalize(content):
    """`content` (.tflite bytes) with the low-rank operands reshaped and the
    float16 constants GATHER / RESHAPE read made float32; the same bytes when
    nothing needs it."""
    fb = schema()
    model = read_model(content)
    changed = False
    for sg in model.subgraphs or []:
        changed |= _fold_fp16_constants(model, sg)
        g = Graph(model, sg)
        new_ops = []
        for op in sg.operators if sg.operators is not None else []:
            for slot in low_rank_operands(g, op, op_name(model, op)):
                src = op.inputs[slot]
                old = sg.tensors[src]
                dims = [1] * (len(g.dims(op.outputs[0])) - len(g.dims(src))) + g.dims(src)
                values = _buffer(model, np.asarray(dims, np.int32))
                shape_t = _tensor(
                    sg, b"gpu_rewrite/shape", [len(dims)], fb.TensorType.INT32, values
                )
                name = (old.name or b"t") + b"/rank%d" % len(dims)
                out_t = _tensor(sg, name, dims, old.type, _buffer(model), old.quantization)
                r = fb.OperatorT()
                r.opcodeIndex = _opcode(model, fb.BuiltinOperator.RESHAPE)
                r.inputs, r.outputs = [src, shape_t], [out_t]
                r.builtinOptionsType = fb.BuiltinOptions.ReshapeOptions
                r.builtinOptions = fb.ReshapeOptionsT()
                r.builtinOptions.newShape = list(dims)
                new_ops.append(r)
                inputs = list(op.inputs)
                inputs[slot] = out_t
                op.inputs = inputs
                changed = True
            new_ops.append(op)
        sg.operators = new_ops
    if not changed:
        return content
    return write_model(model, len(content))


def _opcode(model, builtin):
    for k, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return k
    code = schema().OperatorCodeT()
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)
    code.version = 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _buffer(model, array=None):
    """Appends a buffer holding `array`'s bytes (empty without one); its index."""
    buf = schema().BufferT()
    if array is not None:
        buf.data = np.frombuffer(array.tobytes(), np.uint8)
    model.buffers.append(buf)
    return len(model.buffers) - 1


def _tensor(sg, name, shape, dtype, buffer, quantization=None):
    t = schema().TensorT()
    t.name, t.shape, t.type, t.buffer = name, list(shape), dtype, buffer
    t.quantization = quantization
    sg.tensors.append(t)
    return len(sg.tensors) - 1
