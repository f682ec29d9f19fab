"""
The node's resources, below the broker core: the resource alarms (memory, disk, store;
:mod:`otter_tx.resources.alarms`) and the process's memory footprint and its release to the
system (:mod:`otter_tx.resources.process_memory`).  See docs/architecture.md.
"""
