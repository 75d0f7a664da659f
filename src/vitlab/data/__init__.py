"""Datasets by name or path, the paper's preprocessing, and loaders that resume exactly.

The API other parts of vitlab (and users) call:

    open_dataset(spec, split, transform, *, train=False, seed=0, options=DataOptions()) -> dataset
        (open.py) Items are (transform(image), label): with `model_transform(config)` (what
        `vitlab.transform(model)` returns) a normalised float tensor (C, H, W), label an int.
        The dataset has `.class_names` (list[str]) and a length.
        spec:   digits                 scikit-learn's 8x8 digits, shipped inside vitlab (offline)
                fashion-mnist[:FOLDER] IDX files (gz or not); default Debian's
                                       /usr/share/datasets/fashion-mnist; downloaded when absent
                cifar10[:FOLDER]       torchvision's format (cifar-10-batches-py); downloaded
                cifar100[:FOLDER]        by torchvision when absent and no FOLDER is given
                imagenet-val:DIR       the ImageNet validation images in file-name order (one
                                       folder per wnid, or flat with labels.txt), the order
                                       of the ReaL labels (see imagenet_val.py); split test
                vtab:TASK:ROOT         a VTAB-1k task (data/vtab.py): train = its 1,000
                                       examples, train-minus-dev its 800, dev its 200 val,
                                       test its full test split, as VTAB defines them
                imagefolder:PATH       PATH/CLASS/IMAGE, with PATH/train + PATH/val|test
                                       splits, or a fixed 20% held out as "test"
                wds:PATTERN            WebDataset tar shards (.tar, .tar.gz), brace patterns or
                                       a folder of train-*/test-* shards; streamed (an
                                       IterableDataset split across loader workers and processes)
                synthetic:TASK[:SEED]  a procedural 16x16 task with a known answer: halfswap or
                                       crossover (see synthetic.py; the `synthetic` recipe)
                hf:NAME[:CONFIG]       a Hugging Face dataset by name, from the datasets cache
                                       (offline with HF_HUB_OFFLINE=1), or hf:DIR for a folder
                                       written by save_to_disk; splits train and test (or
                                       validation); needs `datasets` (vitlab[datasets])
        split:  "train", "test" (= "val"), "dev" (a held-out part of train, fixed seed: 2% of
                CIFAR, 10% of others, as the paper) or "train-minus-dev" (the rest).
        transform: what each image goes through: the model's preprocessing for evaluation
                (model_transform(config)), its augmentation for training
                (model_transform(config, train=True, crop_scale=..., randaugment=...,
                autoaugment=..., trivialaugment=..., augmix=..., random_erasing=...)).
        train:  True = a training stream (wds: shuffled, with the seed); the augmentation
                itself is the transform's.
        options: a DataOptions: dev_fraction; skip_bad_images (unreadable images are dropped
                and counted instead of raising BadImageError); shuffle_buffer and classes
                (wds); test_fraction (imagefolder); download (default True: fetch a missing
                named set when online), mirror (fashion-mnist). DataOptions.of(cfg.data)
                is a run's.
        dataset.view(transform, seed=, train=): the opened set read another way, not
                opened again (what a fine-tune's runs share: train/inputs.py).
    read_image(source) -> PIL.Image     decode a file (or bytes) or raise BadImageError naming it
    training_subset(dataset, fraction=1.0, size=0, seed=0) -> dataset
                                        a fixed, class-balanced part of a training set
                                        (--train-fraction, --train-size; see subset.py)
    make_loader(dataset, batch_size, seed=, rank=, world=, train=, start_step=, num_steps=,
                num_workers=) -> DataLoader of (images, labels, skipped names): a whole run's
                training batches (exactly resumable, split over processes), or one
                evaluation pass
    transforms.eval_transform / transforms.train_transform / transforms.model_transform
                the evaluation and the training transform; the training one's decode is a step
                (decode.STEPS: pil, fast -- a JPEG decoded only at the DCT scale its crop
                needs --, cuda -- on the GPU), the crop, flip, augmentations (config.run.
                AUGMENTATIONS) and normalisation (vitlab.pixels) shared; uint8 out for the
                loader (decode.model_input normalises it on the device), or normalised
    images.read_image / images.open_image
                the one image opener: formats, the decompression-bomb limit, and one decision
                of what is an image for every decoder
    foreign.wrap(source, transform) -> any torch Dataset or DataLoader, torchvision dataset or
                Hugging Face datasets object as a vitlab dataset (see foreign.py)

This package never imports vitlab.models: data knows nothing about the network.
"""

from __future__ import annotations

from vitlab.data.datasets import BadImageError, DataError, read_image
from vitlab.data.identity import DEV_FRACTIONS
from vitlab.data.loader import batches_per_epoch, collate, known_length, make_loader
from vitlab.data.open import DataOptions, open_dataset, paper_dataset
from vitlab.data.subset import training_subset

__all__ = [
    "training_subset", "DataOptions",
    "DEV_FRACTIONS", "BadImageError", "DataError", "open_dataset", "paper_dataset", "read_image", "make_loader", "collate", "batches_per_epoch", "known_length",
]
