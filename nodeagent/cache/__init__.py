"""The node's checkpoint and image cache, served read-only to peer nodes.

``naming`` (ids), ``manifest`` (pieces and their hashes), ``ranges`` (the Range header) and
``eviction`` (LRU) are pure; ``store`` is the filesystem adapter, ``credentials`` reads the
bearer token, ``serving`` is the aiohttp server and ``testing`` holds a link emulator and
factories for tests and benchmarks. See docs/peer-cache.md.
"""
