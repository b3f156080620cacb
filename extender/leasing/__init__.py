"""Leasing: the leasing controller that lends an online job's GPUs and takes them back.

The pure decisions (:mod:`.decisions`: a lease's next action; :mod:`.claimpinning`: DRA mode's
claim pins) and their one dispatch (:mod:`.execution`); the controller (:mod:`.controller`), its
DRA step (:mod:`.claimstep`), what it observes (:mod:`.observation`), its writes on the API
server (:mod:`.kubeworld`) and its metrics (:mod:`.metrics`). The GpuLease object and the rules
of right of return are extender.rightofreturn's.
"""
