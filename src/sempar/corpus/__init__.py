"""The multi-domain text corpus, fetched from the package registries and cleaned by our own code."""
