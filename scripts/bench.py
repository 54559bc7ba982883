"""Benchmarks against Hugging Face transformers; the same as the ``zoo-bench`` command."""

from tasks.cli.bench import main

if __name__ == "__main__":
    main()
