"""Reading and writing .tflite flatbuffers: the model object (ModelT), op names and a per-subgraph
view of tensor shapes, dtypes and constants, shared by the delegate check
(export/check.py) and the GPU rewrites (export/gpu_rewrite.py). Read with
ai_edge_litert's schema_py_generated."""

from zoo.cli import UsageError


def enum_names(cls):
    """{value: name} of a schema enum (BuiltinOperator, TensorType)."""
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def schema():
    """ai_edge_litert's schema_py_generated (imported on first use)."""

    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def read_model(content):
    """Parses .tflite bytes into the flatbuffer object API (ModelT)."""
    if len(content) < 8 or content[4:8] != b"TFL3":
        raise UsageError("not a TFLite flatbuffer (no TFL3 identifier)")
    return schema().ModelT.InitFromPackedBuf(bytearray(content), 0)


def write_model(model, size_hint=0):
    """A ModelT (`read_model`'s, changed) back to .tflite bytes."""
    import flatbuffers

    b = flatbuffers.Builder(size_hint + 4096)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def op_name(model, op):
    code = model.operatorCodes[op.opcodeIndex]
    builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
    name = enum_names(schema().BuiltinOperator).get(builtin, f"BUILTIN_{builtin}")
    if name == "CUSTOM":
        custom = (
            code.customCode.decode() if isinstance(code.customCode, bytes) else str(code.customCode)
        )
        return custom if custom.startswith("Flex") else f"CUSTOM:{custom}"
    return name


class Graph:
    def __init__(self, model, sg):
        self.model, self.sg = model, sg
        self.types = enum_names(schema().TensorType)
        # {DEQUANTIZE output: its constant input} (float16 weights, for one)
        self.dequantized = {
            op.outputs[0]: op.inputs[0]
            for op in (sg.operators if sg.operators is not None else [])
            if op_name(model, op) == "DEQUANTIZE" and self._has_data(op.inputs[0])
        }

    def dims(self, i):
        t = self.sg.tensors[i]
        sig = (
            t.shapeSignature if t.shapeSignature is not None and len(t.shapeSignature) else t.shape
        )
        return [int(d) for d in (sig if sig is not None else [])]

    def dtype(self, i):
        return self.types.get(self.sg.tensors[i].type, str(self.sg.tensors[i].type))

    def is_const(self, i):
        """A constant, or a DEQUANTIZE of one (float16 weights: the delegate
        reads them as constants)."""
        return i in self.dequantized or self._has_data(i)

    def _has_data(self, i):
        b = self.sg.tensors[i].buffer
        if not b or b >= len(self.model.buffers):
            return False
        buf = self.model.buffers[b]
        return (buf.data is not None and len(buf.data) > 0) or (buf.offset or 0) > 1

    def describe(self, op):
        def one(i):
            kind = " const" if self.is_const(i) else ""
            return f"[{','.join(map(str, self.dims(i)))}] {self.dtype(i).lower()}{kind}"

        ins = ", ".join(one(i) for i in op.inputs if i >= 0)
        outs = ", ".join(one(i) for i in op.outputs if i >= 0)
        return f"inputs {ins} -> outputs {outs}"
