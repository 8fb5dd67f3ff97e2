"""Code that runs on Spark through Spark Connect.

Spark never talks to the Iceberg catalog: jobs here only turn buffered request bodies into
Parquet files at a location they are given. The committer makes those files part of a table.
"""
