"""recommended.yaml: what a sweep recommends, in a form a training script loads without a GPU or torch.

rec = tunekit.load_recommended("recommended.yaml")
loader = DataLoader(dataset, **rec.dataloader_kwargs())
x = x.to(device, non_blocking=rec.non_blocking)
args = transformers.TrainingArguments(output_dir="out", **rec.training_arguments())
trainer = lightning.pytorch.Trainer(**rec.lightning_trainer_kwargs())

``_record``: :class:`Recommended`, what it gives a training script, and how a sweep writes it; ``_load``: the
file read as strictly as a config (every problem one line naming the key and what is allowed).
"""

from tunekit.recommended._load import load_recommended
from tunekit.recommended._record import RECOMMENDED_VERSION, Recommended, recommendation_dict, worker_threads_init

__all__ = ["Recommended", "load_recommended", "recommendation_dict", "worker_threads_init", "RECOMMENDED_VERSION"]
