"""Image workloads that cost the CPU what a real ImageNet-style input pipeline costs per sample.

`synthetic_jpeg` writes a folder of photo-like JPEG files once (cached on disk) and returns a dataset that
decodes, crops, flips and normalises one of them on every access, exactly like a real training pipeline
reading ImageNet from local disk. `image_folder` does the same for a real `ImageFolder` tree.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import uuid
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets
from torchvision.transforms import v2

from tunekit.config import cpu_count
from tunekit.workloads._common import normalise_index, validate

__all__ = ["synthetic_jpeg", "image_folder", "train_transform", "GpuDecode", "DECODE"]

logger = logging.getLogger(__name__)

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)

_MARKER = "DONE.json"
_RECIPE_VERSION = 1  # bump when the pixel recipe changes, so stale caches are not reused
_POOL_THRESHOLD = 64  # below this many images, generate inline
_MAX_WORKERS = 16
_CHUNKS_PER_WORKER = 4


def train_transform(crop: int = 224) -> v2.Compose:
    """Standard ImageNet training augmentation for a PIL image.

    Args:
        crop: Side of the square output crop, in pixels.

    Returns:
        A transform mapping a PIL RGB image to a normalised float32 tensor of shape ``[3, crop, crop]``.
    """
    return v2.Compose(
        [
            v2.RandomResizedCrop(crop, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=list(_IMAGENET_MEAN), std=list(_IMAGENET_STD)),
        ]
    )


@dataclass(frozen=True)
class _Params:
    """Everything that determines the bytes of the generated files."""

    width: int
    height: int
    quality: int
    seed: int
    num_images: int
    version: int = _RECIPE_VERSION

    @property
    def folder_name(self) -> str:
        return f"{self.width}x{self.height}-q{self.quality}-s{self.seed}-n{self.num_images}-v{self.version}"


DECODE = ("cpu", "gpu", "gpu-overlap")
"""Where a built-in image pipeline decodes and augments: in the loader workers; on the training GPU inside the step;
or on the training GPU one batch ahead, on a stream of its own, while the step trains the batch before."""


class GpuDecode:
    """Decoding and augmentation on the GPU. The loader workers only read each JPEG's bytes; the batch goes to the
    step as one tensor of encoded images (:meth:`collate_fn`), is decoded on the device in one batched
    ``torchvision.io.decode_jpeg`` call, and gets the same augmentation as on the CPU (random resized crop,
    horizontal flip, normalisation), inside the training step. A dataset with this decode carries ``collate_fn``
    and ``batch_to_device``, which the trial uses in place of its own.

    The augmentation is batched (:func:`augment_batch`): transforms v2 draws one crop per call, so a crop per image
    means a call per image, which cost 126 ms for a batch of 512 on an H200 (more than ResNet-50's training step);
    one ``roi_align`` over every image's crop box costs about 4 ms."""

    def __init__(self, crop: int):
        self.crop = crop

    def attach(self, dataset: object, ahead: bool) -> None:
        """Give ``dataset`` this decode's ``collate_fn`` and ``batch_to_device``; with ``ahead``
        (``decode: gpu-overlap``) also ``batch_to_device_ahead``, which asks the trial to run the move one batch
        ahead, on a CUDA stream of its own, beside the step that trains the batch before."""
        dataset.collate_fn = self.collate_fn  # type: ignore[attr-defined]
        dataset.batch_to_device = self.batch_to_device  # type: ignore[attr-defined]
        dataset.batch_to_device_ahead = ahead  # type: ignore[attr-defined]

    @staticmethod
    def collate_fn(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's encoded images end to end in one uint8 tensor, their lengths, and the labels. One tensor
        crosses the worker queue and gets pinned, not one per image: on a 2-core box two workers delivered about
        3x the samples/s this way."""
        data = [d for d, _ in samples]
        return (torch.cat(data), torch.tensor([d.numel() for d in data]),
                torch.tensor([label for _, label in samples]))

    @staticmethod
    def encoded(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
        """Each image's encoded bytes: views of the batch's one tensor."""
        data, lengths, _ = batch
        return list(torch.split(data, lengths.tolist()))

    def batch_to_device(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], ctx: object,
                        non_blocking: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode and augment a batch on ``ctx.device``: a float32 tensor [N, 3, crop, crop] (channels-last when
        ``ctx.channels_last``) and the labels."""
        from torchvision.io import ImageReadMode, decode_jpeg

        device = ctx.device  # type: ignore[attr-defined]
        if device.type != "cuda":
            raise RuntimeError(f"decode: gpu decodes on a CUDA device, but this trial runs on {device}; set decode: "
                               "cpu, or run on a GPU")
        labels = batch[2]
        # nvJPEG's hardware decoder does not wait for work already queued on the stream it is given: it can write
        # into memory the caching allocator just freed while the previous step's kernels still read it (NaN losses
        # on an H200; pytorch/vision#9606). The step's queue is drained before the decode, as the fix there does.
        torch.cuda.current_stream(device).synchronize()
        # decode_jpeg wants the encoded bytes on the CPU and copies them itself (pinned ones without blocking)
        images = decode_jpeg(self.encoded(batch), mode=ImageReadMode.RGB, device=device)
        out = augment_batch(images, self.crop)
        if getattr(ctx, "channels_last", False):
            out = out.contiguous(memory_format=torch.channels_last)
        return out, labels.to(device, non_blocking=non_blocking)


_SCALE = (0.08, 1.0)
_RATIO = (3 / 4, 4 / 3)
_ATTEMPTS = 10


def crop_boxes(height: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """One random resized crop per image, drawn as ``v2.RandomResizedCrop`` draws it (area share in ``_SCALE``,
    log-uniform aspect ratio in ``_RATIO``, up to ten attempts to fit, else the largest centred crop of an allowed
    ratio), for all images at once: boxes ``[N, 4]`` as ``(x1, y1, x2, y2)`` in pixels (float)."""
    n, device = height.numel(), height.device
    h_img, w_img = height.float()[:, None], width.float()[:, None]
    area = h_img * w_img * torch.empty(n, _ATTEMPTS, device=device).uniform_(*_SCALE)
    log_ratio = torch.empty(n, _ATTEMPTS, device=device).uniform_(math.log(_RATIO[0]), math.log(_RATIO[1]))
    w = torch.sqrt(area * torch.exp(log_ratio)).round()
    h = torch.sqrt(area / torch.exp(log_ratio)).round()
    fits = (w > 0) & (w <= w_img) & (h > 0) & (h <= h_img)
    first = torch.where(fits.any(1), fits.float().argmax(1), -1)  # the first attempt that fits, else -1
    pick = first.clamp(min=0)[:, None]
    w, h = w.gather(1, pick)[:, 0], h.gather(1, pick)[:, 0]
    h_img, w_img = h_img[:, 0], w_img[:, 0]
    x1 = (torch.rand(n, device=device) * (w_img - w + 1)).floor()
    y1 = (torch.rand(n, device=device) * (h_img - h + 1)).floor()
    # the fallback: the whole image cut to the nearest allowed ratio, centred
    in_ratio = w_img / h_img
    fw = torch.where(in_ratio > _RATIO[1], (h_img * _RATIO[1]).round(), w_img)
    fh = torch.where(in_ratio < _RATIO[0], (w_img / _RATIO[0]).round(), h_img)
    missed = first < 0
    w, h = torch.where(missed, fw, w), torch.where(missed, fh, h)
    x1 = torch.where(missed, ((w_img - fw) / 2).floor(), x1)
    y1 = torch.where(missed, ((h_img - fh) / 2).floor(), y1)
    return torch.stack([x1, y1, x1 + w, y1 + h], 1)


def augment_batch(images: Sequence[torch.Tensor], crop: int) -> torch.Tensor:
    """The training augmentation of :func:`train_transform` on a batch of decoded uint8 images ``[3, H, W]`` (any
    sizes, on any device): a random resized crop to ``crop`` x ``crop`` per image (bilinear, averaging over each
    output pixel's footprint, as antialiasing does), a horizontal flip of half of them, and the ImageNet
    normalisation. One ``roi_align`` per distinct image size; returns float32 ``[N, 3, crop, crop]``."""
    from torchvision.ops import roi_align

    device = images[0].device
    sizes = torch.tensor([tuple(image.shape[-2:]) for image in images], device=device)
    boxes = crop_boxes(sizes[:, 0], sizes[:, 1])
    out = torch.empty(len(images), 3, crop, crop, device=device)
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, image in enumerate(images):
        groups.setdefault(tuple(image.shape), []).append(index)
    for members in groups.values():
        stacked = torch.stack([images[i] for i in members]).float()
        at = torch.tensor(members, device=device)
        rois = torch.cat([torch.arange(len(members), device=device, dtype=torch.float)[:, None], boxes[at]], 1)
        out[at] = roi_align(stacked, rois, output_size=crop, spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    flip = torch.rand(len(images), device=device) < 0.5
    out = torch.where(flip[:, None, None, None], out.flip(-1), out)
    mean = torch.tensor(_IMAGENET_MEAN, device=device)[:, None, None] * 255
    std = torch.tensor(_IMAGENET_STD, device=device)[:, None, None] * 255
    return (out - mean) / std


def _check_decode(decode: str) -> None:
    if decode not in DECODE:
        raise ValueError(f"decode must be one of {', '.join(DECODE)}, got {decode!r}")


class SyntheticJpegDataset(Dataset):
    """Map-style dataset over a folder of generated JPEG files; decodes and augments on every access.

    Picklable (plain attributes only), so DataLoader workers can use it under fork and spawn alike.

    Args:
        root: Complete cache folder holding ``000000.jpg`` ... files.
        num_images: Number of images in ``root``.
        num_classes: Labels are ``index % num_classes``.
        crop: Side of the square output crop.
    """

    def __init__(self, root: str, num_images: int, num_classes: int, crop: int, decode: str = "cpu") -> None:
        _check_decode(decode)
        self.root = root
        self.num_images = num_images
        self.num_classes = num_classes
        self.crop = crop
        self.decode = decode
        self.transform = train_transform(crop)
        if decode != "cpu":
            GpuDecode(crop).attach(self, ahead=decode == "gpu-overlap")

    def __len__(self) -> int:
        return self.num_images

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        index = normalise_index(index, self.num_images)
        if self.decode != "cpu":  # the bytes only: decoding and augmentation happen on the device
            return read_bytes(_image_path(self.root, index)), index % self.num_classes
        with Image.open(_image_path(self.root, index)) as image:
            rgb = image.convert("RGB")
        return self.transform(rgb), index % self.num_classes

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(root={self.root!r}, num_images={self.num_images}, "
            f"num_classes={self.num_classes}, crop={self.crop}, decode={self.decode!r})"
        )


def synthetic_jpeg(
    num_images: int = 4096,
    crop: int = 224,
    num_classes: int = 100,
    width: int = 500,
    height: int = 375,
    quality: int = 90,
    seed: int = 0,
    cache_dir: str | None = None,
    decode: str = "cpu",
) -> SyntheticJpegDataset:
    """A dataset of photo-like JPEG files on disk, decoded and augmented on every access.

    The files are generated once into
    ``<cache>/synthetic_jpeg/<w>x<h>-q<quality>-s<seed>-n<num_images>-v<recipe>``, where ``<cache>`` is
    ``cache_dir``, else ``$TUNEKIT_CACHE``, else ``~/.cache/tunekit``. Generation is atomic and safe to run
    from several processes at once. Image ``i`` depends only on ``(seed, i)``, the size and the quality; at
    the defaults the files average about 80 KB, like ImageNet photographs.

    Args:
        num_images: Dataset length.
        crop: Side of the square training crop.
        num_classes: Labels are ``index % num_classes``.
        width: Width of the stored JPEG files.
        height: Height of the stored JPEG files.
        quality: JPEG quality (1-100) used when writing the files.
        seed: Non-negative seed; different seeds give different images.
        cache_dir: Root of the on-disk cache; see above for the default.
        decode: ``cpu``: the loader workers decode and augment; ``gpu``: they only read the bytes, and the batch is
            decoded and augmented on the training GPU inside the step (:class:`GpuDecode`); ``gpu-overlap``: the
            same, one batch ahead on a CUDA stream of its own, beside the step.

    Returns:
        A map-style dataset yielding ``(float32 tensor [3, crop, crop], int label)``.

    Raises:
        ValueError: If an argument is out of range.
    """
    validate(num_images=num_images, crop=crop, num_classes=num_classes, width=width, height=height)
    validate(seed=seed, minimum=0)
    if not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ValueError(f"quality must be an integer in 1..100, got {quality!r}")
    params = _Params(width=width, height=height, quality=quality, seed=seed, num_images=num_images)
    _check_decode(decode)
    folder = _ensure_generated(_cache_root(cache_dir) / "synthetic_jpeg", params)
    return SyntheticJpegDataset(str(folder), num_images=num_images, num_classes=num_classes, crop=crop,
                                decode=decode)


def image_folder(root: str, crop: int = 224, decode: str = "cpu") -> datasets.ImageFolder:
    """A real ``ImageFolder`` tree (``root/<class>/<image>``) with the standard training transform.

    Args:
        root: Folder holding one sub-folder of images per class.
        crop: Side of the square training crop.
        decode: ``cpu``: the loader workers decode and augment; ``gpu``: they only read each file's bytes, and the
            batch is decoded and augmented on the training GPU inside the step (:class:`GpuDecode`; JPEG files
            only); ``gpu-overlap``: the same, one batch ahead on a CUDA stream of its own, beside the step.

    Returns:
        A ``torchvision.datasets.ImageFolder`` yielding ``(float32 tensor [3, crop, crop], int label)``.

    Raises:
        FileNotFoundError: If ``root`` does not exist or holds no class folders with images.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"image folder root {root!r} does not exist or is not a directory")
    _check_decode(decode)
    try:
        if decode == "cpu":
            return datasets.ImageFolder(root, transform=train_transform(crop))
        folder = datasets.ImageFolder(root, loader=read_bytes, is_valid_file=_is_jpeg)
        GpuDecode(crop).attach(folder, ahead=decode == "gpu-overlap")
        return folder
    except FileNotFoundError as err:
        raise FileNotFoundError(f"image folder root {root!r} holds no class folders with images") from err


# --------------------------------------------------------------------------------------------- helpers




def read_bytes(path: str) -> torch.Tensor:
    """A file's bytes as a uint8 tensor in ordinary memory (``torchvision.io.read_file``'s tensor cannot be sent
    from a DataLoader worker: its storage has no file descriptor to share)."""
    with open(path, "rb") as fh:
        return torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8)


def _is_jpeg(path: str) -> bool:
    return path.lower().endswith((".jpg", ".jpeg"))


def _image_path(root: str | Path, index: int) -> str:
    return os.path.join(root, f"{index:06d}.jpg")


def _cache_root(cache_dir: str | None) -> Path:
    root = cache_dir or os.environ.get("TUNEKIT_CACHE") or os.path.join("~", ".cache", "tunekit")
    return Path(root).expanduser()


# ------------------------------------------------------------------------------------------- the cache


def _ensure_generated(parent: Path, params: _Params) -> Path:
    """Return the complete cache folder for ``params``, generating it first if needed."""
    target = parent / params.folder_name
    if _is_complete(target, params):
        return target
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{params.folder_name}.tmp-", dir=parent))
    try:
        logger.info("generating %d synthetic JPEGs into %s", params.num_images, target)
        _generate(tmp, params)
        _write_marker(tmp, params)
        _install(tmp, target, params)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_complete(folder: Path, params: _Params) -> bool:
    """Trust a folder only if its marker matches ``params`` and every image file is present."""
    try:
        marker = json.loads((folder / _MARKER).read_text())
        names = os.listdir(folder)
    except (OSError, ValueError):
        return False
    expected = {**asdict(params), "count": params.num_images}
    jpegs = sum(name.endswith(".jpg") for name in names)
    return marker == expected and jpegs == params.num_images


def _write_marker(folder: Path, params: _Params) -> None:
    marker = {**asdict(params), "count": params.num_images}
    (folder / _MARKER).write_text(json.dumps(marker, sort_keys=True))


def _install(tmp: Path, target: Path, params: _Params) -> None:
    """Atomically rename ``tmp`` to ``target``; if another process got there first, keep its folder."""
    for _ in range(5):
        try:
            os.rename(tmp, target)
            return
        except OSError:
            if _is_complete(target, params):
                return  # another process won the race; the caller deletes tmp
            _discard(target)  # stale or tampered folder without a valid marker
    raise RuntimeError(f"could not install generated images at {target}")


def _discard(folder: Path) -> None:
    """Move ``folder`` out of the way atomically, then delete it."""
    trash = folder.with_name(f".{folder.name}.trash-{uuid.uuid4().hex}")
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


# ------------------------------------------------------------------------------------------ generation


def _generate(folder: Path, params: _Params) -> None:
    """Write all images of ``params`` into ``folder``, in worker processes when there are many."""
    # Daemonic processes (e.g. DataLoader workers) may not have children: generate inline there too.
    if params.num_images < _POOL_THRESHOLD or multiprocessing.current_process().daemon:
        _write_range(str(folder), params, 0, params.num_images)
        return
    workers = min(cpu_count(), _MAX_WORKERS)
    chunk = math.ceil(params.num_images / (workers * _CHUNKS_PER_WORKER))
    bounds = [(start, min(start + chunk, params.num_images)) for start in range(0, params.num_images, chunk)]
    with _process_pool(workers) as pool:
        futures = [pool.submit(_write_range, str(folder), params, start, stop) for start, stop in bounds]
        for future in futures:
            future.result()


def _process_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool; on Linux it forks, so workers skip re-importing torch (seconds per process)."""
    if not sys.platform.startswith("linux"):
        return ProcessPoolExecutor(max_workers=workers)
    with warnings.catch_warnings():
        # Python >= 3.12 warns when forking a multi-threaded process; the children only run numpy and PIL.
        warnings.filterwarnings("ignore", r".*fork\(\) may lead to deadlocks", DeprecationWarning)
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
        # With fork, all workers start on the first submit: start them here, inside the warnings filter.
        pool.submit(int).result()
    return pool


def _write_range(folder: str, params: _Params, start: int, stop: int) -> None:
    for index in range(start, stop):
        pixels = _render(params.seed, index, params.width, params.height)
        Image.fromarray(pixels).save(
            _image_path(folder, index), format="JPEG", quality=params.quality, optimize=False
        )


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


def _noise(
    rng: np.random.Generator, width: int, height: int, cells: Sequence[int], falloff: float
) -> np.ndarray:
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
