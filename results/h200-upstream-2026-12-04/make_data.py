"""Synthetic JPEGs in ImageFolder layout for torchvision's reference train.py: DIR/train and DIR/val, 10 classes
(its top-5 accuracy needs at least 5), 256 x 256 noise at quality 90; DIR/train and DIR/val are emptied first, so
that they hold exactly the counts asked for. Usage: make_data.py DIR TRAIN VAL"""
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

CLASSES = 10


def write(job: tuple[str, int]) -> None:
    folder, i = job
    pixels = np.random.default_rng(i).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(os.path.join(folder, f"{i:06d}.jpg"), quality=90)


def main() -> None:
    root, counts = sys.argv[1], {"train": int(sys.argv[2]), "val": int(sys.argv[3])}
    jobs = []
    for split, count in counts.items():
        shutil.rmtree(os.path.join(root, split), ignore_errors=True)  # a larger earlier set would stay behind
        for c in range(CLASSES):
            os.makedirs(os.path.join(root, split, f"c{c}"), exist_ok=True)
        jobs += [(os.path.join(root, split, f"c{i % CLASSES}"), i + (0 if split == "train" else 10**6))
                 for i in range(count)]
    with ProcessPoolExecutor() as pool:
        list(pool.map(write, jobs, chunksize=256))


if __name__ == "__main__":
    main()
