"""Image workloads that cost the CPU what a real ImageNet-style input pipeline costs per sample.

`synthetic_jpeg` writes a folder of photo-like JPEG files once (cached on disk) and returns a dataset that
decodes, crops, flips and normalises one of them on every access, exactly like a real training pipeline
reading ImageNet from local disk. `image_folder` does the same for a real `ImageFolder` tree. By concept:
``_pipeline`` (the decode-and-augment transforms, on the CPU or the GPU), ``_datasets`` (the two datasets),
``_cache`` (the JPEG folder written once, in parallel, and reused) and ``_render`` (a photo-like image's pixels).
"""

from tunekit.workloads.images._datasets import SyntheticJpegDataset, image_folder, read_bytes, synthetic_jpeg
from tunekit.workloads.images._pipeline import DECODE, GpuDecode, augment_batch, crop_boxes, train_transform

__all__ = [
    "synthetic_jpeg",
    "image_folder",
    "train_transform",
    "GpuDecode",
    "DECODE",
    "augment_batch",
    "crop_boxes",
    "SyntheticJpegDataset",
    "read_bytes",
]
