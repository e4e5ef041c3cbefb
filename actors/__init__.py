"""Actors: live concurrency on Trio (session actors, the session store, the cold reader).

Arrives with the actors issue; it may import `subagents.storage`, trio and trio-util.
"""
