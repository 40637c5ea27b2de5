"""`python -m train.sagan.digits OUT_DIR`: a real image set offline, for `--image-dir`.

Writes the handwritten digits that scikit-learn ships as `load_digits` (the test set
of UCI optdigits, E. Alpaydin and C. Kaynak, 1998, CC BY 4.0: 1,797 8x8 grey images of
0-9 by 13 writers) as PNG files, one sub-folder per digit, upsampled to `--size` pixels
(a power of two >= 32, what the SAGAN generator makes). The data travel with this
package (digits.csv.gz, scikit-learn's file: 64 ink levels 0..16 and the digit per
line), so nothing is downloaded and scikit-learn is not needed: installed, it would
cost every Keras import ~0.6 s (Keras imports it when it is there):

    python -m train.sagan.digits runs/digits
    python -m train sagan --image-dir runs/digits --out runs/sagan-digits

The images are written as RGB (the grey value in all three channels), since
`--image-dir` reads RGB. OUT_DIR must not exist or be empty: nothing is overwritten.
"""

import os
import sys

import numpy as np

from zoo.cli import OneLineParser, UsageError, cli_boundary

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")


def write_digits(out_dir, size=32):
    """Writes OUT_DIR/<digit>/<index>.png (ink white on black); returns the number of images."""
    from PIL import Image

    from train.sagan.images import check_size

    check_size(size, flag="--size")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise UsageError(f"OUT_DIR exists and is not an empty directory: {out_dir}")
    table = np.loadtxt(DATA, delimiter=",", dtype=np.int64)
    labels = table[:, -1]
    # 0..16 ink levels -> 0..255, then a bicubic upsampling (smooth strokes, not 4x4 blocks).
    small = np.round(table[:, :-1].reshape(-1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)
    staging = out_dir.rstrip(os.sep) + ".partial"
    if os.path.exists(staging):
        raise UsageError(f"a previous conversion left {staging}; remove it first")
    for i, (image, label) in enumerate(zip(small, labels)):
        folder = os.path.join(staging, str(int(label)))
        os.makedirs(folder, exist_ok=True)
        image = np.asarray(Image.fromarray(image).resize((size, size), Image.BICUBIC))
        Image.fromarray(np.repeat(image[..., None], 3, axis=-1)).save(
            os.path.join(folder, f"{i:04d}.png")
        )
    # All files at once: an interrupted conversion leaves no half-filled OUT_DIR.
    if os.path.isdir(out_dir):
        os.rmdir(out_dir)
    os.replace(staging, out_dir)
    return len(small)


def main(argv=None):
    parser = OneLineParser(
        prog="python -m train.sagan.digits",
        description="write the UCI handwritten digits (scikit-learn's load_digits) as a --image-dir folder",
    )
    parser.add_argument("out_dir", help="directory to create (one sub-folder per digit)")
    parser.add_argument(
        "--size", type=int, default=32, help="image side (power of two >= 32; default 32)"
    )

    def body():
        args = parser.parse_args(argv)
        n = write_digits(args.out_dir, args.size)
        print(f"wrote {n} digit images ({args.size}x{args.size}) to {args.out_dir}")
        return 0

    return cli_boundary(body, argv)


if __name__ == "__main__":
    sys.exit(main())
