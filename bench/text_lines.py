"""Labelled text-line images drawn with Pillow (the system's DejaVu fonts), for measuring OCR
models' accuracy against ground truth without downloads: bench/calibration.py.

``text_line(rng)`` -> (x [1, 3, 48, 320] float32 as PaddleOCR's recognizer preprocesses it:
height 48, width by aspect ratio up to 320, (x/255 - 0.5)/0.5, zero padding on the right;
the text). ``digits=True``: digits only (the issue's "digits accuracy").
``oriented_line(rng)`` -> (x [1, 3, 48, 192], label 0 or 1: upright or turned 180 degrees),
PP-OCR's text-direction classifier's input and classes.
"""

from __future__ import annotations

import glob

import numpy as np

FONTS = sorted(glob.glob("/usr/share/fonts/truetype/dejavu/*.ttf")
               + glob.glob("/usr/share/fonts/truetype/liberation*/*.ttf"))
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CHARS = "0123456789" * 3 + LETTERS + "-.:/"


def _render(text: str, rng: np.random.Generator):
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    if not FONTS:
        raise RuntimeError("no TrueType fonts under /usr/share/fonts/truetype (fonts-dejavu)")
    font = ImageFont.truetype(FONTS[int(rng.integers(len(FONTS)))], int(rng.integers(26, 40)))
    left, top, right, bottom = font.getbbox(text)
    pad = int(rng.integers(2, 10))
    bg, fg = int(rng.integers(180, 256)), int(rng.integers(0, 90))
    img = Image.new("L", (right - left + 2 * pad, bottom - top + 2 * pad), bg)
    ImageDraw.Draw(img).text((pad - left, pad - top), text, fill=fg, font=font)
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.0))))
    noisy = np.asarray(img, np.float32) + rng.normal(0, rng.uniform(0, 8), (img.height,
                                                                          img.width))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).convert("RGB")


def _paddle(img, h: int, w: int) -> np.ndarray:
    from PIL import Image

    rw = min(w, int(np.ceil(h * img.width / img.height)))
    x = (np.asarray(img.resize((rw, h), Image.BILINEAR), np.float32) / 255.0 - 0.5) / 0.5
    out = np.zeros((1, 3, h, w), np.float32)
    out[0, :, :, :rw] = x.transpose(2, 0, 1)
    return out


def random_text(rng: np.random.Generator, digits: bool = False) -> str:
    alphabet = list("0123456789" if digits else CHARS)
    n = int(rng.integers(4, 14))
    text = "".join(rng.choice(alphabet, n))
    if rng.random() < 0.3:   # two words
        k = int(rng.integers(1, n))
        text = text[:k] + " " + text[k:]
    return text.strip()


def text_line(rng: np.random.Generator, digits: bool = False, h: int = 48, w: int = 320
              ) -> tuple[np.ndarray, str]:
    text = random_text(rng, digits)
    return _paddle(_render(text, rng), h, w), text


def oriented_line(rng: np.random.Generator, h: int = 48, w: int = 192) -> tuple[np.ndarray, int]:
    img = _render(random_text(rng), rng)
    label = int(rng.random() < 0.5)
    if label:
        img = img.rotate(180)
    return _paddle(img, h, w), label


def ctc_decode(probs: np.ndarray, chars: list[str]) -> str:
    """Greedy CTC: argmax per step, repeats merged, blanks (0) dropped; ``chars`` the model's
    dictionary (index i + 1), anything past it a space (PaddleOCR's use_space_char)."""
    out, prev = [], 0
    for i in np.asarray(probs).reshape(-1, np.shape(probs)[-1]).argmax(-1):
        if i != prev and i != 0:
            out.append(chars[i - 1] if i - 1 < len(chars) else " ")
        prev = i
    return "".join(out)


def edit_distance(a: str, b: str) -> int:
    d = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, cb in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (ca != cb))
    return d[-1]
