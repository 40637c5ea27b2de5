"""Generate images with a trained SAGAN: `python -m zoo.generate PATH --out grid.png`.

PATH is a SAGAN run directory (its model.keras, run with Keras) or a .tflite
file exported from one (with its sidecar `<file>.json`; run with `zoo.lite`,
no TensorFlow). `--class` picks the class (id or name from
RUN_DIR/vocab/classes.txt) of a conditional generator; without it, a
conditional generator draws one row per class. Writes a PNG grid and says so
("wrote ..."; `--verbose 0`: nothing but errors).
Bad input: one line on stderr, exit 2; nothing existing is overwritten
without --force.
"""

import os
import sys

import numpy as np

from zoo import atomic, run_lock
from zoo.cli import UsageError as _Usage
from zoo.cli import (
    cli_boundary,
    command_parser,
    quiet_stderr,
    verbosity,
)
from zoo.tasks import load_for_command


def grid(images, columns, pad=1):
    """uint8 [N, H, W, C] -> one uint8 mosaic with `columns` per row (white gaps)."""
    images = np.asarray(images)
    n, h, w, c = images.shape
    rows = -(-n // columns)
    out = np.full((rows * (h + pad) + pad, columns * (w + pad) + pad, c), 255, np.uint8)
    for i, image in enumerate(images):
        r, k = divmod(i, columns)
        top, left = pad + r * (h + pad), pad + k * (w + pad)
        out[top : top + h, left : left + w] = image
    return out


def save_png(array, path):
    """Writes a uint8 [H, W, C] array as PNG (nearest upscaled 2x), atomically."""
    import io

    from PIL import Image

    array = np.asarray(array).repeat(2, axis=0).repeat(2, axis=1)
    if array.shape[-1] == 1:
        array = array[..., 0]
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    atomic.write_bytes(path, buffer.getvalue())


def _class_id(value, generator):
    if value is None:
        return None
    if not generator.num_classes:
        raise _Usage(f"--class {value!r}: this generator is unconditional")
    if value in generator.class_names:
        return generator.class_names.index(value)
    try:
        k = int(value)
    except ValueError:
        raise _Usage(
            f"--class must be a class id or one of {generator.class_names}: {value!r}"
        ) from None
    if not 0 <= k < generator.num_classes:
        raise _Usage(f"--class must be in [0, {generator.num_classes}), got {k}")
    return k


def main(argv=None):
    parser = command_parser("zoo.generate", __doc__)
    parser.add_argument("path", help="SAGAN run directory or exported .tflite file")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--class", dest="class_", help="class id or name (conditional generators)")
    parser.add_argument(
        "--num", type=int, default=16, help="images (default 16; per class without --class)"
    )
    parser.add_argument("--columns", type=int, default=8, help="grid columns (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="noise seed")
    parser.add_argument("--force", action="store_true", help="overwrite --out")

    def body():
        args = parser.parse_args(argv)
        level = verbosity(args.verbose)
        if args.num < 1 or args.columns < 1:
            raise _Usage(f"--num and --columns must be >= 1, got {args.num} and {args.columns}")
        if not args.out.lower().endswith(".png"):
            raise _Usage(f"--out must be a .png file: {args.out}")
        if os.path.exists(args.out) and not args.force:
            raise _Usage(f"--out exists (use --force to overwrite): {args.out}")
        if os.path.isdir(args.out):
            raise _Usage(f"--out is a directory: {args.out}")
        run_lock.check_writable_ancestor(args.out, "--out")
        if not os.path.exists(args.path):
            raise _Usage(f"no such run directory or .tflite file: {args.path}")
        if not os.path.isdir(args.path) and not args.path.endswith(".tflite"):
            raise _Usage(f"expected a run directory or a .tflite file: {args.path}")
        with quiet_stderr(level == 0):
            generator = load_for_command(args.path, "sagan")()
            k = _class_id(args.class_, generator)
            if generator.num_classes and k is None:
                labels = np.repeat(np.arange(generator.num_classes), args.num).astype(np.int32)
                columns = args.num
            else:
                labels = np.full(args.num, k or 0, np.int32)
                columns = min(args.columns, args.num)
            if generator.conditional:
                images = generator.generate(labels, seed=args.seed)
            else:
                images = generator.generate(seed=args.seed, num_images=len(labels))
        uint8 = np.clip(np.round(np.asarray(images) * 255.0), 0, 255).astype(np.uint8)
        save_png(grid(uint8, columns), args.out)
        if level:  # the PNG is the result; this line is progress
            print(f"wrote {args.out} ({len(labels)} images)")
        return 0

    return cli_boundary(body, argv)


if __name__ == "__main__":
    sys.exit(main())
