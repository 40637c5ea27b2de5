"""`python -m train.data.digits DIR`, the name the converter had before it moved to
`train.sagan.digits`."""

import sys

from train.sagan.digits import main

if __name__ == "__main__":
    sys.exit(main())
