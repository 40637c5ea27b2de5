"""Kept so that `python -m train.data.digits` keeps working (train.sagan.digits)."""
