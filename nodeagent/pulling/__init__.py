"""Pulling a checkpoint (or image) from several peers at once, each sending part of it.

``assignment`` (shards to links by earliest completion, shard size, work stealing) and
``estimation`` (link latency and rate) are pure; ``peers`` finds who holds an entry; ``puller``
does the transfers; ``command`` is the ``tidelease cache`` subcommand. See docs/peer-cache.md.

Reference: chaos III (docs/references.md).
"""
