"""Stand-in for IPython.display: the two names `sglang.utils` imports; text goes to stdout."""

from __future__ import annotations


class HTML:
    def __init__(self, data: str = "") -> None:
        self.data = data


def display(*objs: object, **kwargs: object) -> None:
    for obj in objs:
        print(getattr(obj, "data", obj))
