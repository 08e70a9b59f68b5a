"""Tests for tunekit.workloads.images: synthetic JPEG cache, dataset semantics and image_folder."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from tunekit.workloads.images import GpuDecode, augment_batch, crop_boxes, image_folder, synthetic_jpeg, train_transform

SMALL = {"width": 96, "height": 72}
MARKER = "DONE.json"


def _jpegs(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).glob("*.jpg"))


def _mtimes(folder: str | Path) -> dict[str, int]:
    return {entry.name: entry.stat().st_mtime_ns for entry in Path(folder).iterdir()}


def test_default_images_compress_like_photographs(tmp_path: Path) -> None:
    ds = synthetic_jpeg(num_images=16, cache_dir=str(tmp_path))
    files = _jpegs(ds.root)
    assert len(files) == 16
    sizes = [f.stat().st_size for f in files]
    mean_kb = sum(sizes) / len(sizes) / 1024
    assert 60 <= mean_kb <= 110, f"mean JPEG size {mean_kb:.1f} KB outside 60-110 KB"
    assert len(set(sizes)) > 1
    for f in files:
        with Image.open(f) as image:
            assert image.format == "JPEG"
            assert image.size == (500, 375)
            assert image.mode == "RGB"
            image.load()


def test_dataset_items(tmp_path: Path) -> None:
    ds = synthetic_jpeg(num_images=8, crop=32, num_classes=3, cache_dir=str(tmp_path), **SMALL)
    assert len(ds) == 8
    xs = []
    for i in range(len(ds)):
        x, label = ds[i]
        assert isinstance(label, int) and label == i % 3
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32
        xs.append(x)
    batch = torch.stack(xs)
    # ImageNet normalisation maps [0, 1] into roughly [-2.12, 2.64]; without it everything would be >= 0.
    assert batch.min() >= -2.2 and batch.max() <= 2.7
    assert batch.min() < 0 < batch.max()
    assert abs(batch.mean().item()) < 1.0
    assert batch.std().item() > 0.1
    assert ds[-1][1] == 7 % 3
    with pytest.raises(IndexError):
        ds[8]


def test_decodes_on_every_access(tmp_path: Path) -> None:
    ds = synthetic_jpeg(num_images=2, crop=32, cache_dir=str(tmp_path), **SMALL)
    x0, _ = ds[0]
    (Path(ds.root) / "000000.jpg").write_bytes((Path(ds.root) / "000001.jpg").read_bytes())
    torch.manual_seed(0)
    swapped, _ = ds[0]
    torch.manual_seed(0)
    reference, _ = ds[1]
    assert torch.equal(swapped, reference)


def test_deterministic_given_seed(tmp_path: Path) -> None:
    a = synthetic_jpeg(num_images=2, seed=5, cache_dir=str(tmp_path / "a"), **SMALL)
    b = synthetic_jpeg(num_images=2, seed=5, cache_dir=str(tmp_path / "b"), **SMALL)
    c = synthetic_jpeg(num_images=2, seed=6, cache_dir=str(tmp_path / "c"), **SMALL)
    first = [(Path(ds.root) / "000000.jpg").read_bytes() for ds in (a, b, c)]
    assert first[0] == first[1]
    assert first[0] != first[2]
    assert (Path(a.root) / "000000.jpg").read_bytes() != (Path(a.root) / "000001.jpg").read_bytes()


def test_cache_reused_and_untrusted_folder_regenerated(tmp_path: Path) -> None:
    ds = synthetic_jpeg(num_images=6, cache_dir=str(tmp_path), **SMALL)
    root = Path(ds.root)
    assert root.parent == tmp_path / "synthetic_jpeg"
    assert (root / MARKER).is_file()
    before = _mtimes(root)
    original = (root / "000003.jpg").read_bytes()

    again = synthetic_jpeg(num_images=6, crop=64, num_classes=2, cache_dir=str(tmp_path), **SMALL)
    assert again.root == ds.root
    assert _mtimes(root) == before

    # Without the marker the folder is not trusted, even though the image files are there.
    (root / MARKER).unlink()
    (root / "000003.jpg").write_bytes(b"not a jpeg")
    synthetic_jpeg(num_images=6, cache_dir=str(tmp_path), **SMALL)
    assert (root / MARKER).is_file()
    assert (root / "000003.jpg").read_bytes() == original

    # A folder with its marker but missing an image is not trusted either.
    (root / "000001.jpg").unlink()
    synthetic_jpeg(num_images=6, cache_dir=str(tmp_path), **SMALL)
    assert len(_jpegs(root)) == 6
    assert os.listdir(tmp_path / "synthetic_jpeg") == [root.name]


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "env"))
    ds = synthetic_jpeg(num_images=1, **SMALL)
    assert Path(ds.root).parent == tmp_path / "env" / "synthetic_jpeg"


def test_dataset_is_picklable(tmp_path: Path) -> None:
    ds = synthetic_jpeg(num_images=3, crop=32, num_classes=2, cache_dir=str(tmp_path), **SMALL)
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == 3 and clone.root == ds.root
    x, label = clone[2]
    assert x.shape == (3, 32, 32) and label == 0


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_in_dataloader_workers(tmp_path: Path, context: str) -> None:
    ds = synthetic_jpeg(num_images=8, crop=32, num_classes=5, cache_dir=str(tmp_path), **SMALL)
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context)
    x, y = next(iter(loader))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    assert y.tolist() == [0, 1, 2, 3]


def test_pool_generation(tmp_path: Path) -> None:
    ds = synthetic_jpeg(num_images=64, width=48, height=32, seed=1, cache_dir=str(tmp_path))
    files = _jpegs(ds.root)
    assert [f.name for f in files] == [f"{i:06d}.jpg" for i in range(64)]
    inline = synthetic_jpeg(num_images=2, width=48, height=32, seed=1, cache_dir=str(tmp_path / "inline"))
    assert files[1].read_bytes() == (Path(inline.root) / "000001.jpg").read_bytes()


def test_concurrent_generation(tmp_path: Path) -> None:
    kwargs = {"num_images": 64, "width": 160, "height": 120, "cache_dir": str(tmp_path)}
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=synthetic_jpeg, kwargs=kwargs) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    (folder,) = (tmp_path / "synthetic_jpeg").iterdir()  # no temporary or trash folders left behind
    names = sorted(os.listdir(folder))
    assert names == sorted([f"{i:06d}.jpg" for i in range(64)] + [MARKER])
    ds = synthetic_jpeg(**kwargs)
    assert Path(ds.root) == folder


def test_invalid_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_images"):
        synthetic_jpeg(num_images=0, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="quality"):
        synthetic_jpeg(num_images=1, quality=0, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="seed"):
        synthetic_jpeg(num_images=1, seed=-1, cache_dir=str(tmp_path))


def test_train_transform_shape() -> None:
    x = train_transform(40)(Image.new("RGB", (80, 60), (255, 0, 0)))
    assert x.shape == (3, 40, 40) and x.dtype == torch.float32
    expected_red = (1 - 0.485) / 0.229
    assert torch.allclose(x[0], torch.full((40, 40), expected_red), atol=1e-4)


def test_image_folder(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for cls, colour in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
        (root / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (64, 48), colour).save(root / cls / f"{i}.jpg", quality=90)
    ds = image_folder(str(root), crop=32)
    assert ds.classes == ["cat", "dog"]
    assert len(ds) == 4
    x, label = ds[3]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert label == 1


def test_image_folder_missing_or_empty(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        image_folder(str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=re.escape(str(empty))):
        image_folder(str(empty))
    (empty / "cls").mkdir()
    with pytest.raises(FileNotFoundError, match=re.escape(str(empty))):
        image_folder(str(empty))


def test_decode_on_the_gpu_leaves_the_workers_only_the_bytes(tmp_path: Path) -> None:
    """decode: gpu: the dataset yields a JPEG's bytes (what a worker reads), its collate puts a batch's bytes in one
    tensor from which each image's bytes come back whole (they decode to the stored images), and moving a batch to
    a CPU device is refused in one clear line (the GPU path itself is tests/test_gpu.py's)."""
    ds = synthetic_jpeg(num_images=4, crop=32, decode="gpu", cache_dir=str(tmp_path), **SMALL)
    data, label = ds[1]
    assert data.dtype == torch.uint8 and data.dim() == 1 and label == 1
    assert bytes(data[:2].tolist()) == b"\xff\xd8"  # a JPEG's start-of-image marker: not decoded
    batch = next(iter(DataLoader(ds, batch_size=3, num_workers=2, collate_fn=ds.collate_fn)))
    assert batch[0].dim() == 1 and batch[1].sum() == batch[0].numel() and batch[2].tolist() == [0, 1, 2]
    encoded = GpuDecode.encoded(batch)
    assert [e.numel() for e in encoded] == batch[1].tolist()
    assert all(torch.equal(e, ds[i][0]) for i, e in enumerate(encoded))
    from torchvision.io import decode_jpeg

    assert [tuple(image.shape) for image in decode_jpeg(encoded)] == [(3, 72, 96)] * 3

    class Cpu:
        device = torch.device("cpu")

    with pytest.raises(RuntimeError, match="decode: gpu decodes on a CUDA device, but this trial runs on cpu"):
        ds.batch_to_device(batch, Cpu(), non_blocking=False)
    with pytest.raises(ValueError, match="decode must be one of cpu, gpu"):
        synthetic_jpeg(num_images=4, decode="npu", cache_dir=str(tmp_path), **SMALL)
    assert not hasattr(synthetic_jpeg(num_images=4, cache_dir=str(tmp_path), **SMALL), "batch_to_device")


def test_crop_boxes_are_drawn_like_random_resized_crop() -> None:
    """Every box lies inside its image, and area shares and aspect ratios follow torchvision's own draw (same
    means and spreads); an image no allowed box fits gets torchvision's centred fallback."""
    from torchvision import transforms

    torch.manual_seed(0)
    n = 4000
    boxes = crop_boxes(torch.full((n,), 375), torch.full((n,), 500))
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 500).all() and (boxes[:, 3] <= 375).all()
    assert (boxes == boxes.round()).all()  # whole pixels, as torchvision crops
    draw = transforms.RandomResizedCrop.get_params
    theirs = torch.tensor(
        [draw(torch.empty(3, 375, 500), (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(n)], dtype=torch.float
    )
    share, their_share = w * h / (375 * 500), theirs[:, 2] * theirs[:, 3] / (375 * 500)
    assert abs(share.mean() - their_share.mean()) < 0.03 and abs(share.std() - their_share.std()) < 0.03
    ratio, their_ratio = w / h, theirs[:, 3] / theirs[:, 2]
    assert abs(ratio.mean() - their_ratio.mean()) < 0.03
    assert ratio.min() > 0.70 and ratio.max() < 1.40
    assert len(set(boxes[:, 0].tolist())) > 100  # positions vary
    # a strip 1000 x 10: no box of ratio 3/4..4/3 with 8 % of its area fits, so the draw falls back to a centred
    # 13 x 10 box, as torchvision's: j = (1000 - 13) // 2
    assert crop_boxes(torch.tensor([10]), torch.tensor([1000])).tolist() == [[493.0, 0.0, 506.0, 10.0]]


def test_batched_augmentation_matches_the_cpu_transform() -> None:
    """augment_batch on images of two sizes: the shape and dtype of the CPU pipeline's output, normalised like it
    (a flat grey image maps to one known value), and a full-image box without a flip is a plain resize."""
    grey = torch.full((3, 90, 120), 128, dtype=torch.uint8)
    images = [grey, grey.clone(), torch.full((3, 60, 40), 128, dtype=torch.uint8)]
    out = augment_batch(images, 32)
    assert out.shape == (3, 3, 32, 32) and out.dtype == torch.float32
    expected = train_transform(32)(Image.new("RGB", (120, 90), (128, 128, 128)))
    torch.testing.assert_close(out, expected.expand(3, -1, -1, -1), atol=1e-3, rtol=0)
    ramp = torch.arange(64, dtype=torch.float).repeat(3, 64, 1)  # brightness grows left to right
    from torchvision.ops import roi_align

    resized = roi_align(ramp[None], torch.tensor([[0.0, 0, 0, 64, 64]]), 32, 1.0, -1, True)[0]
    torch.testing.assert_close(resized, torch.nn.functional.avg_pool2d(ramp[None], 2)[0])
