"""What crosses Redis between the roles, each record a typed class with its encoder and decoder
side by side, and the Lua scripts that write them (taking field names from the records):

- input_entry.py: one buffered HTTP request on a tenant's input stream (api -> writer)
- commit_entry.py: files a writer wrote for one table, and what to do with them (CommitEntry,
  Operation), on the table's commit stream (writer -> committer)
- receipts.py: what happened to a request (api, writer and committer all write it)
- changes.py: a leader's request to apply row changes, and a writer's answer (committer <-> writer)
- compaction.py: a leader's compaction request (committer -> writer)
- feeds.py: a feed reader's request for a snapshot's changes computed on Spark, and the answer
- upkeep.py: the last run of each upkeep task of a table (committer, writer -> api)
- heartbeats.py: each role's liveness and what it leads or reaches
- scripts.py: the Lua scripts that write these records atomically, and the lease scripts
- stream_ids.py: Redis stream entry ids
"""
