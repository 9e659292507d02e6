"""Parquet shards through fsspec: list input shards, read rows, write output shards atomically."""
