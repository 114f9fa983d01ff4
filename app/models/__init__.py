"""Models on disk: the catalogue, references, the hub, mirrors, fetching, integrity records, progress."""
