"""Reference training workloads: the book's MLP/ViT case study, rebuilt without downloads.

The package exists so that the dataset, collator and model classes are importable by name
(``workloads.data`` ...): DataLoader workers started with ``spawn``/``forkserver`` unpickle
them by module path, which would fail for classes defined in a script run as ``__main__``.
"""
