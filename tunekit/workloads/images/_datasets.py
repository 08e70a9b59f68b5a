"""The built-in image datasets: synthetic JPEGs from the cache, and a real ``ImageFolder`` tree, each decoding
and augmenting one image per access."""

from __future__ import annotations

import os

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets

from tunekit.workloads._common import normalise_index, validate
from tunekit.workloads.images._cache import _cache_root, _ensure_generated, _image_path, _Params
from tunekit.workloads.images._pipeline import GpuDecode, _check_decode, train_transform


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
    return SyntheticJpegDataset(str(folder), num_images=num_images, num_classes=num_classes, crop=crop, decode=decode)


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


def read_bytes(path: str) -> torch.Tensor:
    """A file's bytes as a uint8 tensor in ordinary memory (``torchvision.io.read_file``'s tensor cannot be sent
    from a DataLoader worker: its storage has no file descriptor to share)."""
    with open(path, "rb") as fh:
        return torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8)


def _is_jpeg(path: str) -> bool:
    return path.lower().endswith((".jpg", ".jpeg"))
