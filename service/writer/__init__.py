"""The writer role: input streams in, one Spark job per batch, Parquet files handed to the committer."""
