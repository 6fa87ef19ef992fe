"""A generated vision-language data set: coloured shapes on a plain background, and what colour they are.

twinkle's multimodal counterpart of the embedded self-cognition rows: the cookbook, the tests and
the benchmark train on it with no download. Each row is a standard-format conversation asking
"What colour is the shape?" about one image; the answer is the colour name.
"""

from __future__ import annotations

import io
import random
from typing import Any

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 20)}
SHAPES = ("circle", "square", "triangle")
QUESTION = "What colour is the shape?"


def shape_image(colour: str, shape: str, size: int = 64, rng: random.Random | None = None) -> Any:
    """A PIL image of one ``shape`` in ``colour`` at a random place on a light background."""
    from twinkle.extras import require

    require("PIL.ImageDraw", "drawing the shapes data")
    from PIL import Image, ImageDraw

    rng = rng or random.Random(0)
    image = Image.new("RGB", (size, size), (245, 245, 240))
    draw = ImageDraw.Draw(image)
    extent = rng.randint(size // 3, size // 2)
    x, y = rng.randint(0, size - extent), rng.randint(0, size - extent)
    box = (x, y, x + extent, y + extent)
    fill = COLOURS[colour]
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(x + extent // 2, y), (x, y + extent), (x + extent, y + extent)], fill=fill)
    return image


def shape_rows(n: int, seed: int = 0, size: int = 64, as_bytes: bool = True) -> list[dict[str, Any]]:
    """``n`` rows ``{'messages': [...], 'images': [png bytes or PIL image], 'colour', 'shape'}``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
        image = shape_image(colour, shape, size, rng)
        if as_bytes:
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            image = buffer.getvalue()
        rows.append({"messages": [{"role": "user", "content": f"<image>{QUESTION}"},
                                  {"role": "assistant", "content": colour}],
                     "images": [image], "colour": colour, "shape": shape})
    return rows
