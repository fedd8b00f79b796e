"""run.py with the preset's pretraining changed for research: not product flags.

    python bench/trainer_variant.py --order file --decay all_but_biases -- pretrain vanilla wiki.txt --preset cpu ...
    python bench/trainer_variant.py --mix_questions birth_places_train.tsv -- pretrain rope wiki.txt --preset cpu ...

--order: bucketed (the cpu preset's), shuffled, or file (the handout's trainer: the same batches in
file order every epoch); --decay: matmul (the cpu preset's) or all_but_biases (the handout's
trainer). On a GPU the handout's recipe reached the course's figures only with both of the
handout's settings (bench/RESEARCH.md); this asks whether either helps the cpu recipe.

--mix_questions: every pretraining epoch also trains on these questions (loss on the answer only,
as in finetuning), shuffled in with the corrupted documents: the "mixed training" after which
"Physics of Language Models, Part 3.1" (2023) found knowledge extractable for the other people.
The dev people's questions are never seen. With --preset cpu the plan after the first epoch
counts the questions' tokens, so the cosine still ends with the run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import run  # noqa: E402
from dataset import ORDERS, CharCorruptionDataset, NameDataset, _batches  # noqa: E402
from utils import find_data_file  # noqa: E402


class MixedDataset(torch.utils.data.Dataset):
    """One corrupted example per document and one example per question in every epoch, shuffled together."""

    def __init__(self, corpus: CharCorruptionDataset, questions: NameDataset):
        self.corpus, self.questions = corpus, questions
        self.example_length = corpus.example_length

    def __len__(self) -> int:
        return len(self.corpus) + len(self.questions)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.corpus)
        return self.corpus[i] if i < n else self.questions[i - n]

    def epoch_batches(
        self, batch_size: int, rng: np.random.Generator, order: str = "bucketed"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        doc_ids, doc_len = self.corpus.corrupted_ids(rng.permutation(len(self.corpus)), rng)
        q_ids, q_len, q_mask = self.questions.examples(rng.permutation(len(self.questions)))
        ids, real_len = np.concatenate([doc_ids, q_ids]), np.concatenate([doc_len, q_len])
        mask = np.concatenate([np.ones_like(doc_ids, dtype=bool), q_mask])
        mix = rng.permutation(len(ids))
        yield from _batches(ids[mix], real_len[mix], batch_size, rng, order == "bucketed", mask[mix])


def mixing_trainer(questions_path: str) -> type:
    """run.Trainer, but pretraining on the corpus trains on the questions too."""

    class MixingTrainer(run.Trainer):
        def __init__(self, model, dataset, config, *args, **kwargs):
            if isinstance(dataset, CharCorruptionDataset):
                questions = NameDataset(dataset, find_data_file(questions_path, "--mix_questions file"))
                dataset = MixedDataset(dataset, questions)
                print(f"pretraining on {len(dataset.corpus)} documents and {len(questions)} questions per epoch")
            super().__init__(model, dataset, config, *args, **kwargs)

    return MixingTrainer


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    at = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--order", choices=ORDERS, default=None)
    p.add_argument("--decay", choices=["matmul", "all_but_biases"], default=None)
    p.add_argument("--mix_questions", default=None, metavar="TSV")
    args = p.parse_args(argv[:at])
    command = argv[at + 1 :]
    if command[:1] == ["pretrain"]:  # the variants change pretraining only
        command += [f"--{key}={getattr(args, key)}" for key in ("order", "decay") if getattr(args, key) is not None]
    if args.mix_questions:
        run.Trainer = mixing_trainer(args.mix_questions)
    return run.main(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
