"""The node's checkpoint and image cache, served read-only to peer nodes.

``naming`` (ids), ``manifest`` (pieces and their hashes), ``ranges`` (the Range header) and
``eviction`` (LRU, sizes) and ``identity`` (who a peer is, from a TokenReview) are pure;
``store`` is the filesystem adapter, ``credentials`` reads the agent's own projected token,
``peerauth`` reviews a peer's with the API server, ``serving`` is the aiohttp server and
``testing`` holds a link emulator, a fake TokenReview endpoint and factories for tests and
benchmarks. See docs/peer-cache.md.
"""
