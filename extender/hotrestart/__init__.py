"""The hot-restart operator: the pure decision (a wished image change -> an in-place
restart request) and the operator that watches pods and writes requests; the node agents
carry the requests out (:mod:`nodeagent.hotrestart`)."""
