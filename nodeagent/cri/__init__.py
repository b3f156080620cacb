"""The node's container runtime through the Kubernetes CRI (runtime.v1): a typed async client
behind a :class:`~nodeagent.cri.runtime.Runtime` protocol, a faithful in-memory fake
(:mod:`nodeagent.cri.testing`), and the generated protobuf modules of the subset used
(``api.proto``; hack/gen-proto.sh)."""
