"""The symbolic outputs of layers that may also return attention scores."""

import keras


class ScoresOutputSpec:
    """Mixin for layers whose `compute_output_shape(shape,
    return_attention_scores)` gives one shape, or two with the scores."""

    def compute_output_spec(self, inputs, return_attention_scores=False, **kwargs):
        shapes = self.compute_output_shape(inputs.shape, return_attention_scores)
        if not return_attention_scores:
            return keras.KerasTensor(shapes, dtype=self.compute_dtype)
        return tuple(keras.KerasTensor(s, dtype=self.compute_dtype) for s in shapes)
