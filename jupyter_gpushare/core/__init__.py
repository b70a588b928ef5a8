"""The pure core: model, admission, placement, preemption and GPU-hours.

Nothing in this package performs I/O or imports a framework; adapters (broker,
spawners, server extension, batch backends) call it and translate its answers.
"""
