"""The decode-and-augment pipeline of the built-in image workloads: torchvision's transforms in the loader
workers (``cpu``), or the batch decoded and augmented on the training GPU inside the step (``gpu``,
``gpu-overlap``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torchvision.transforms import v2

_IMAGENET_MEAN = (0.485, 0.456, 0.406)


_IMAGENET_STD = (0.229, 0.224, 0.225)


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
        return (torch.cat(data), torch.tensor([d.numel() for d in data]), torch.tensor([label for _, label in samples]))

    @staticmethod
    def encoded(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
        """Each image's encoded bytes: views of the batch's one tensor."""
        data, lengths, _ = batch
        return list(torch.split(data, lengths.tolist()))

    def batch_to_device(
        self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], ctx: object, non_blocking: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode and augment a batch on ``ctx.device``: a float32 tensor [N, 3, crop, crop] (channels-last when
        ``ctx.channels_last``) and the labels."""
        from torchvision.io import ImageReadMode, decode_jpeg

        device = ctx.device  # type: ignore[attr-defined]
        if device.type != "cuda":
            raise RuntimeError(
                f"decode: gpu decodes on a CUDA device, but this trial runs on {device}; set decode: "
                "cpu, or run on a GPU"
            )
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
