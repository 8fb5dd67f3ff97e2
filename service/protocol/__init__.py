"""What crosses Redis between the roles, each record a typed class with its encoder and decoder
side by side, and the Lua scripts that write them (taking field names from the records):

- input_entry.py: one buffered HTTP request on a tenant's input stream (api -> writer)
- commit_entry.py: files a writer wrote for one table, on its commit stream (writer -> committer)
- receipts.py: what happened to a request (api, writer and committer all write it)
- scripts.py: the Lua scripts that write these records atomically
- stream_ids.py: Redis stream entry ids
"""
