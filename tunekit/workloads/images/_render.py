"""A photo-like image's pixels from a seed: a background, shapes, detail and noise, so a JPEG of it decodes at a
real photo's cost."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image


def _render(seed: int, index: int, width: int, height: int) -> np.ndarray:
    """Photo-like RGB pixels for image ``index``: smooth colour fields, objects, fine texture and grain."""
    rng = np.random.default_rng([seed, index])
    pixels = _background(rng, width, height)
    _paint_shapes(rng, pixels)
    _add_detail(rng, pixels)
    np.clip(pixels, 0, 255, out=pixels)
    return np.ascontiguousarray(pixels.astype(np.uint8).transpose(1, 2, 0))


def _background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Smooth multi-octave luminance plus correlated colour variation, planar: ``[3, height, width]``."""
    luminance = _noise(rng, width, height, cells=(2, 4, 8, 16, 32), falloff=0.6)
    chroma_a = _noise(rng, width, height, cells=(2, 4, 8, 16), falloff=0.6)
    chroma_b = _noise(rng, width, height, cells=(2, 4, 8, 16), falloff=0.6)
    base = rng.uniform(70, 180, 3).astype(np.float32)
    mix = rng.uniform(-25, 25, (2, 3)).astype(np.float32)
    contrast = np.float32(rng.uniform(20, 40))
    luminance *= contrast
    planes = [luminance + base[c] + mix[0, c] * chroma_a + mix[1, c] * chroma_b for c in range(3)]
    return np.stack(planes)


def _paint_shapes(rng: np.random.Generator, pixels: np.ndarray) -> None:
    """Blend a few flat-coloured ellipses and rectangles into planar ``pixels`` in place (edges, objects)."""
    _, height, width = pixels.shape
    for _ in range(int(rng.integers(3, 9))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(10, width / 3), rng.uniform(10, height / 3)
        is_ellipse = rng.random() < 0.5
        colour = rng.uniform(0, 255, (3, 1, 1)).astype(np.float32)
        alpha = np.float32(rng.uniform(0.6, 1.0))
        x0, x1 = max(0, int(cx - rx)), min(width, int(cx + rx) + 1)
        y0, y1 = max(0, int(cy - ry)), min(height, int(cy + ry) + 1)
        region = pixels[:, y0:y1, x0:x1]
        if is_ellipse:
            dy = ((np.arange(y0, y1, dtype=np.float32) - cy) / ry) ** 2
            dx = ((np.arange(x0, x1, dtype=np.float32) - cx) / rx) ** 2
            weight = alpha * (dy[:, None] + dx[None, :] <= 1)
            region += weight * (colour - region)
        else:
            region += alpha * (colour - region)


def _add_detail(rng: np.random.Generator, pixels: np.ndarray) -> None:
    """Add spatially varying fine texture and grain to planar ``pixels``; this sets the JPEG size."""
    _, height, width = pixels.shape
    periods = (8, 4, 2)  # texture wavelengths in pixels, so bytes per pixel do not depend on image size
    texture = _noise(rng, width, height, cells=tuple(max(2, width // p) for p in periods), falloff=1.0)
    mask = 0.5 + 0.5 * np.tanh(_noise(rng, width, height, cells=(2, 4, 8), falloff=0.6))
    detail = np.float32(rng.uniform(20, 90)) * mask * texture
    detail += np.float32(rng.uniform(4, 8)) * rng.standard_normal((height, width), dtype=np.float32)
    pixels += detail


def _noise(rng: np.random.Generator, width: int, height: int, cells: Sequence[int], falloff: float) -> np.ndarray:
    """Zero-mean, unit-variance smooth noise summed over octaves (a Laplacian-pyramid style synthesis).

    Each octave is a random grid ``cells`` wide, added to the bicubic upscale of the coarser octaves, with
    amplitude multiplied by ``falloff`` per octave; only the final sum is upscaled to full size.
    """
    field: np.ndarray | None = None
    for octave, across in enumerate(cells):
        grid_w, grid_h = across + 1, max(2, round(across * height / width)) + 1
        layer = rng.standard_normal((grid_h, grid_w), dtype=np.float32) * np.float32(falloff**octave)
        field = layer if field is None else _resize(field, grid_w, grid_h) + layer
    assert field is not None
    field = _resize(field, width, height)
    field -= field.mean()
    field /= field.std() + np.float32(1e-6)
    return field


def _resize(field: np.ndarray, width: int, height: int) -> np.ndarray:
    image = Image.fromarray(field).resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(image, dtype=np.float32).copy()
